"""A bounded open-loop load driver for accuracy tests (127.0.0.1 only).

Sends requests at a fixed rate for a fixed time, round-robin over proxy replicas, and
records every outcome: nothing is dropped silently, and the run always ends (each
request has a timeout, the loop a deadline).

The fake upstream usually runs in this (the test session's) process. While the load runs,
the cyclic garbage collector is off: late in a session a full collection of its heap
pauses every thread for longer than a strict upstream's window tolerates (1% of a 10 s
window is 100 ms), and requests paced exactly by the proxies would reach the fake
upstream bunched up, as no real upstream would see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@dataclass
class Outcome:
    status: int  # 0 = transport error
    code: str | None = None
    retry_after: str | None = None
    sent_at: float = 0.0  # seconds since the load started
    done_at: float = 0.0
    queue_ms: float = 0.0  # what the proxy says it waited (x-llm-proxy-queue-ms)


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0

    def count(self, status: int) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def statuses(self) -> Counter[int]:
        return Counter(o.status for o in self.outcomes)

    @property
    def codes(self) -> Counter[str | None]:
        return Counter(o.code for o in self.outcomes if o.status != 200)


# Idle connections are dropped well before uvicorn's 5 s keep-alive closes them: with the
# same 5 s on both sides, a request sent on a connection the server is closing fails in
# transit (a race of the test client, not an answer of the proxy).
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=1000, keepalive_expiry=2.0)


async def drive(
    urls: list[str],
    rate: float,
    duration: float,
    *,
    api_key: str | None = None,
    body: dict[str, Any] | None = None,
    timeout: float = 30.0,
    path: str = "/chat/completions",
) -> LoadResult:
    """POST chat completions (or ``body`` to ``path`` under each URL: ``/messages``) at
    ``rate`` per second for ``duration`` seconds."""
    with _collector_paused():
        return await _drive(urls, rate, duration, api_key, body, timeout, path)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def _drive(
    urls: list[str],
    rate: float,
    duration: float,
    api_key: str | None,
    body: dict[str, Any] | None,
    timeout: float,
    path: str,
) -> LoadResult:
    result = LoadResult()
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=timeout, limits=_LIMITS) as client:

        async def one(url: str) -> None:
            result.outcomes.append(await _post(client, url + path, headers, body, start))

        tasks: list[asyncio.Task[None]] = []
        interval = 1.0 / rate
        n = 0
        while (next_at := start + n * interval) < start + duration:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(urls[n % len(urls)])))
            n += 1
        result.sent = n
        await asyncio.gather(*tasks)
    return result


async def closed_loop(
    urls: list[str],
    connections: int,
    duration: float,
    *,
    api_key: str | None = None,
    body: dict[str, Any] | None = None,
    timeout: float = 60.0,
) -> LoadResult:
    """``connections`` clients, each sending its next request when the last is answered,
    until ``duration`` seconds have passed (client i uses ``urls[i % len(urls)]``)."""
    with _collector_paused():
        result = LoadResult()
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        start = time.monotonic()
        async with httpx.AsyncClient(timeout=timeout, limits=_LIMITS) as client:

            async def client_loop(url: str) -> None:
                while time.monotonic() - start < duration:
                    result.outcomes.append(
                        await _post(client, f"{url}/chat/completions", headers, body, start)
                    )
                    result.sent += 1

            await asyncio.gather(*(client_loop(urls[i % len(urls)]) for i in range(connections)))
        return result


async def _post(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    start: float,
) -> Outcome:
    sent_at = time.monotonic() - start
    try:
        response = await client.post(url, json=body or CHAT, headers=headers)
    except httpx.HTTPError as exc:  # its class is the code: a failure says what
        return Outcome(0, type(exc).__name__, sent_at=sent_at, done_at=sent_at)
    code = None
    if response.status_code != 200:
        try:
            error = response.json()["error"]
            code = error.get("code") or error["type"]  # Anthropic's errors: their type
        except (ValueError, KeyError, TypeError, AttributeError):
            code = "unparseable"
    done_at = time.monotonic() - start
    retry_after = response.headers.get("retry-after")
    queue_ms = float(response.headers.get("x-llm-proxy-queue-ms", "0"))
    return Outcome(response.status_code, code, retry_after, sent_at, done_at, queue_ms)


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)] if ordered else 0.0
