"""The strict fake upstream in a process of its own, for load scenarios.

In the test session's process it would share the load generator's interpreter lock, and
stamp arrivals late as it waits for it: a strict window of a second would read turns
sent in time as a burst. Its counters: ``GET /stats`` (``stats``), zeroed by ``reset``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from support.ports import free_port
from support.waiting import wait_until


@contextlib.contextmanager
def strict_upstream_process(
    tmp_path: Path, *, rpm: int, window: float, latency: float = 0.02
) -> Iterator[str]:
    """``proxy fake-upstream`` taking ``rpm`` requests in any sliding ``window`` seconds,
    each answered after ``latency`` seconds, telling no rate-limit headers (only its 429s
    and their retry-after); its URL yielded, its log in ``tmp_path / upstream.log``."""
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "fake-upstream", "--port", str(port)]
    argv += ["--rpm", str(rpm), "--window", f"{window:g}", "--latency", f"{latency:g}"]
    argv += ["--no-ratelimit-headers", "--log-level", "WARNING"]
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "upstream.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(url), 20.0, "the fake upstream to start")
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/stats", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stats(url: str) -> dict[str, Any]:
    """The upstream's counters (fake_upstream/stats.py)."""
    counters: dict[str, Any] = httpx.get(f"{url}/stats", timeout=10).json()
    return counters


def reset(url: str) -> None:
    """Its counters zeroed (and its windows emptied)."""
    httpx.post(f"{url}/stats/reset", timeout=10).raise_for_status()
