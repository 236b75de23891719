"""A proxy with something to show on its admin state: a deployment cooling down after a
failure and a request waiting for its turn on another (real servers, real clients)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai

from support.ports import free_port

ADMIN_KEY = "admin-secret-key"
KEY = "sk-team-a"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def config(
    upstream_url: str, redis_url: str | None = None, lookahead: str = "0s"
) -> dict[str, Any]:
    """Model ``flaky``: one deployment nothing answers at (it cools after one failure,
    for a minute). Model ``slow``: one deployment at 1 request a minute (the second
    request waits about a minute for its turn: with ``lookahead`` 0, holding that turn;
    with fair share's lookahead, deferred without one, waiting on the model)."""
    return {
        "redis": {"url": redis_url or ""},
        "admin": {"keys": [ADMIN_KEY]},
        "keys": [{"name": "team-a", "key": KEY, "rpm": 100, "tpd": 1000000, "max_parallel": 5}],
        "models": [
            {
                "name": "flaky",
                "deployments": [
                    {"id": "broken", "base_url": f"http://127.0.0.1:{free_port()}/v1", "rpm": 60}
                ],
            },
            {
                "name": "slow",
                "deployments": [{"id": "paced", "base_url": upstream_url, "rpm": 1}],
            },
        ],
        "routing": {
            "retries": 0,
            "max_wait": "120s",
            "lookahead": lookahead,
            "cooldown": {"allowed_fails": 1, "window": "60s", "time": "60s"},
        },
    }


def sdk_chat(base_url: str, key: str, model: str) -> tuple[int, str | None]:
    """Status and error code of one chat completion of ``key`` through the OpenAI SDK
    (``base_url``: the proxy's ``/v1``)."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=10)
    try:
        client.chat.completions.create(**chat(model))
    except openai.APIStatusError as failed:
        return failed.status_code, getattr(failed, "code", None)
    return 200, None


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@asynccontextmanager
async def cooling_and_waiting(url: str) -> AsyncIterator[None]:
    """``broken`` cooling and one request of ``team-a`` waiting on ``paced`` while inside."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    try:
        await client.chat.completions.create(**chat("flaky"))
        raise AssertionError("the broken deployment answered")
    except openai.APIStatusError as failed:
        assert failed.status_code == 502, failed
    await client.chat.completions.create(**chat("slow"))  # the minute's one request
    async with httpx.AsyncClient(timeout=120) as raw:
        headers = {"authorization": f"Bearer {KEY}"}
        waiting = asyncio.ensure_future(
            raw.post(f"{url}/v1/chat/completions", json=chat("slow"), headers=headers)
        )
        try:
            yield
        finally:
            waiting.cancel()  # the client leaves: the proxy gives its turn back
            await asyncio.gather(waiting, return_exceptions=True)
    await client.close()


async def poll_state(
    url: str, condition: Callable[[dict[str, Any]], bool], timeout: float = 10.0
) -> dict[str, Any]:
    """The first admin state that meets ``condition`` (bounded)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            reply = await client.get(f"{url}/admin/state", headers=ADMIN)
            assert reply.status_code == 200, reply.text
            view: dict[str, Any] = reply.json()
            if condition(view):
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"admin state not reached in {timeout:g} s: {view}")
            await asyncio.sleep(0.05)


def deployment(view: dict[str, Any], model: str, deployment_id: str) -> dict[str, Any]:
    group = next(m for m in view["models"] if m["name"] == model)
    found: dict[str, Any] = next(d for d in group["deployments"] if d["id"] == deployment_id)
    return found


def key(view: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(k for k in view["keys"] if k["name"] == name)
    return found


def shows_cooling_and_waiting(view: dict[str, Any]) -> bool:
    return (
        deployment(view, "flaky", "broken")["health"]["state"] == "cooling"
        and deployment(view, "slow", "paced")["waiting"] == 1
        and key(view, "team-a")["waiting"] == 1
    )
