"""Proxies in the states the admin page is screenshot in: idle (some traffic done),
loaded (requests in flight and waiting) and saturated (requests waiting, 429s). Real
servers: a scripted upstream that answers at once, or holds a request (``"user":
"hold"``) until the proxy gives up on it, behind a real proxy driven by real clients.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from support.admin import ADMIN_KEY
from support.raw_upstream import Conversation, answer

KEYS = {"alice": "sk-alice", "bob": "sk-bob", "ci-bot": "sk-ci-bot"}
BASIC = {"authorization": "Basic " + base64.b64encode(f"admin:{ADMIN_KEY}".encode()).decode()}
PRICE = {"input": 2.5, "output": 10.0}  # dollars per million tokens
USAGE = {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500}


def screenshot_dir(tmp_path: Path) -> Path:
    """Where a test keeps its screenshots: ``$ADMIN_SCREENSHOTS`` (``docs``: the ones
    the docs show, ``make admin-screenshots``), else the test's temp dir."""
    return Path(os.environ.get("ADMIN_SCREENSHOTS") or tmp_path)


async def scripted(conversation: Conversation) -> None:
    """A chat completion at once, or held until the client goes (``"user": "hold"``), or
    without its usage (``"user": "no-usage"``: the proxy reports an estimate)."""
    body = orjson.loads(conversation.request.body)
    if body.get("user") == "hold":
        await conversation.stall()
        return
    completion: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "m"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
    if body.get("user") != "no-usage":
        completion["usage"] = USAGE
    await conversation.send(answer(orjson.dumps(completion), "content-type: application/json"))


def config(upstream_url: str, redis_url: str = "", max_queue: int = 1000) -> dict[str, Any]:
    """Two models (one of two deployments, one paced at 6 a minute), a team with a
    monthly budget, three keys with windows of a minute and of a day, budgets and
    parallel slots. A turn up to 15 s ahead is held by the request waiting for it; one
    farther waits for any deployment (fair share's lookahead). ``max_queue``: requests
    that may wait at once (past it: 429 ``queue_full``)."""
    base = f"{upstream_url}/v1"
    return {
        "redis": {"url": redis_url},
        "admin": {"keys": [ADMIN_KEY]},
        "teams": [{"name": "research", "rpm": 300, "budgets": [{"usd": 100, "period": "month"}]}],
        "keys": [
            {
                "name": "alice",
                "key": KEYS["alice"],
                "team": "research",
                "rpm": 60,
                "rpd": 1000,
                "max_parallel": 4,
                "budgets": [{"usd": 20, "period": "day"}],
            },
            {
                "name": "bob",
                "key": KEYS["bob"],
                "rpm": 5,
                "tpd": 200000,
                "budgets": [{"tokens": 1000000, "period": "week"}],
            },
            {"name": "ci-bot", "key": KEYS["ci-bot"], "rpm": 120, "priority": 1, "weight": 2},
        ],
        "models": [
            {
                "name": "gpt-4o",
                "price": PRICE,
                "deployments": [
                    {"id": "gpt-4o-east", "base_url": base, "rpm": 60, "tpm": 100000},
                    {"id": "gpt-4o-west", "base_url": base, "rpm": 30},
                ],
            },
            {
                "name": "mini",
                "price": {"input": 0.15, "output": 0.6},
                "deployments": [{"id": "mini-1", "base_url": base, "rpm": 6}],
            },
        ],
        "routing": {"max_wait": "120s", "lookahead": "15s", "max_queue": max_queue, "retries": 0},
    }


def chat(model: str, user: str = "") -> dict[str, Any]:
    """A chat request; ``user``: what the scripted upstream does with it (``hold``,
    ``no-usage``; else an answer at once)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 300,
    }
    if user:
        body["user"] = user
    return body


async def send(
    client: httpx.AsyncClient, url: str, key: str, model: str, n: int, user: str = ""
) -> list[httpx.Response]:
    """``n`` requests of ``key`` at once, answered (or refused)."""
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    return await asyncio.gather(
        *(
            client.post(f"{url}/v1/chat/completions", json=chat(model, user), headers=headers)
            for _ in range(n)
        )
    )


@asynccontextmanager
async def pending(
    client: httpx.AsyncClient, url: str, key: str, model: str, n: int
) -> AsyncIterator[list[asyncio.Task[httpx.Response]]]:
    """``n`` requests of ``key`` under way (held upstream, or waiting for a turn) while
    inside; cancelled on the way out (their clients leave)."""
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    tasks = [
        asyncio.ensure_future(
            client.post(f"{url}/v1/chat/completions", json=chat(model, "hold"), headers=headers)
        )
        for _ in range(n)
    ]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
