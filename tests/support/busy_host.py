"""A busy host for load scenarios (issue 55, "Exact at full use").

The issue measures the limiter on a quiet host and on a *busy* one: a host where two
CPU-bound processes run beside the proxy (on the 2-core CI host: every core taken, so the
proxy's, the upstream's and the load generator's processes are descheduled for whole
time slices, and a turn may leave late by as much). ``busy_host()`` makes one: it starts
``processes`` processes that each spin on the CPU, doing nothing else, for at most
``seconds``. Each ends on its own when its seconds are up, even if the test that started
it dies (killed, or stuck); leaving the ``with`` block ends them at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

# "spawn": a fresh interpreter, not a fork of the test session (its threads, its locks).
_CONTEXT = multiprocessing.get_context("spawn")


def spin(seconds: float, spinning: Event | None = None) -> None:
    """Keep one core busy for ``seconds`` (the monotonic clock's), then return;
    ``spinning`` is set as it begins."""
    deadline = time.monotonic() + seconds
    if spinning is not None:
        spinning.set()
    n = 0
    while time.monotonic() < deadline:
        for _ in range(10_000):  # the clock is read every few hundred microseconds
            n += 1


def _wait_spinning(spinners: list[BaseProcess], spinning: list[Event]) -> None:
    """Return once every spinner spins; raise if one ended first or 30 s passed."""
    deadline = time.monotonic() + 30.0
    for spinner, event in zip(spinners, spinning, strict=True):
        while not event.wait(0.05):
            if not spinner.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{spinner.name} did not spin (exit {spinner.exitcode})")


@contextlib.contextmanager
def busy_host(processes: int = 2, seconds: float = 120.0) -> Iterator[list[int]]:
    """``processes`` CPU-bound processes running for at most ``seconds`` (their pids
    yielded once every one spins), terminated when the block ends."""
    spinning = [_CONTEXT.Event() for _ in range(processes)]
    spinners = [
        _CONTEXT.Process(target=spin, args=(seconds, s), name=f"busy-{i}", daemon=True)
        for i, s in enumerate(spinning)
    ]
    try:
        for spinner in spinners:
            spinner.start()
        _wait_spinning(spinners, spinning)
        yield [s.pid for s in spinners if s.pid is not None]
    finally:
        for spinner in spinners:
            if spinner.pid is not None and spinner.is_alive():
                spinner.terminate()
        for spinner in spinners:
            if spinner.pid is not None:
                spinner.join(10)
