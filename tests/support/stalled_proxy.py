"""``llm-proxy serve`` whose event loop is stalled now and then: a replica on a busy
machine (a neighbour's burst, a slow callback, a collection), as production replicas are.

Run as ``python -m support.stalled_proxy serve --config ...`` with ``tests`` on the path
(``ProxyProcess(..., module=STALLED)`` does). The server's own loop runs one more task:
every ``STALL_EVERY_MS`` milliseconds on average (exponential gaps, and at least
``MIN_GAP``: two stalls back to back would be one twice as long) it blocks the loop for a
time drawn uniformly up to ``STALL_MAX_MS`` (default 100 and 50; 0: no stalls). It
blocks with ``time.sleep``: to the loop that is a busy callback, without burning a shared
CPU. Each stall is counted, and how late each request woke for its turn is measured; the
counts, the longest stall and the latest wake-ups (and how many came later than
``STALL_BEYOND_MS``, default 60) are logged at shutdown.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Any

import uvicorn

from proxy.process.cli import main
from proxy.routing import dispatcher
from proxy.routing.settlement import Settler, Turn

__all__ = ["STALLED"]

STALLED = "support.stalled_proxy"  # the module ProxyProcess runs
MAX_ENV, EVERY_ENV, BEYOND_ENV = "STALL_MAX_MS", "STALL_EVERY_MS", "STALL_BEYOND_MS"
MIN_GAP = 0.01  # seconds the loop runs free between stalls (a send takes a few turns)


async def _stall(longest: float, every: float, rng: random.Random) -> None:
    count, worst = 0, 0.0
    try:
        while True:
            await asyncio.sleep(MIN_GAP + rng.expovariate(1.0 / every))
            started = time.perf_counter()
            time.sleep(rng.uniform(0.0, longest))  # the loop is blocked: nothing else runs
            worst = max(worst, time.perf_counter() - started)
            count += 1
    finally:
        print(f"stalled the loop {count} times, longest {worst * 1000:.1f} ms", flush=True)


def _measure_wake_ups() -> list[float]:
    """How late each request's sleep until its turn ended (seconds), as it happens."""
    late: list[float] = []
    until_stale = dispatcher._until_stale

    async def measured(seconds: float, turn: Turn, settler: Settler) -> None:
        due = time.monotonic() + seconds
        await until_stale(seconds, turn, settler)
        if not settler.stale(turn):
            late.append(time.monotonic() - due)

    dispatcher._until_stale = measured
    return late


def _report(late: list[float], beyond: float) -> None:
    worst = sorted(late)[-3:]
    print(
        f"woke {len(late)} times for a turn: {sum(x > 0.02 for x in late)} over 20 ms late,"
        f" {sum(x > beyond for x in late)} beyond {beyond * 1000:g} ms; latest"
        f" {', '.join(f'{x * 1000:.1f}' for x in reversed(worst))} ms",
        flush=True,
    )


def _install() -> None:
    longest = float(os.environ.get(MAX_ENV, "50")) / 1000.0
    every = float(os.environ.get(EVERY_ENV, "100")) / 1000.0
    beyond = float(os.environ.get(BEYOND_ENV, "60")) / 1000.0
    serve = uvicorn.Server._serve  # inside serve's signal capture: ends before its exit
    late = _measure_wake_ups()

    async def stalled_serve(self: uvicorn.Server, *args: Any, **kwargs: Any) -> None:
        stalls = None
        if longest > 0.0:
            stalls = asyncio.create_task(_stall(longest, every, random.Random()))
        try:
            await serve(self, *args, **kwargs)
        finally:
            if stalls is not None:
                stalls.cancel()
                await asyncio.gather(stalls, return_exceptions=True)  # its count is logged
            _report(late, beyond)

    uvicorn.Server._serve = stalled_serve  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    sys.exit(main())
