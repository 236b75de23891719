"""The fake upstreams of the real-traffic benchmark: the shared one's options changed
while it runs (``POST /control``), strict ones started per deployment, their counters
(``GET /stats``, ``POST /stats/reset``; docs/fake_upstream.md)."""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

from loadtest.bench.servers import Processes, wait_until
from loadtest.topology import LOOPBACK, free_port

# What the fake upstream answers like, by the bench's row: no latency at all (the
# proxy's own cost), or a real model's (a fixed 300 ms to the first byte, streams of 30
# chunks 10 ms apart: fixed, so that what the proxy adds shows in the percentiles).
INSTANT = {"latency": 0, "stream_chunks": 8, "chunk_delay": 0}
MODEL_LATENCY = {"latency": 0.3, "stream_chunks": 30, "chunk_delay": 0.01}
DEFAULTS = {"latency": 0, "stream_chunks": 8, "chunk_delay": 0.01}  # as servers() starts it


def _call(url: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(  # noqa: S310 (loopback)
        url, body, {"Content-Type": "application/json"}, method="GET" if body is None else "POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
        found: dict[str, Any] = json.loads(response.read())
        return found


def control(url: str, **options: Any) -> dict[str, Any]:
    return _call(f"{url}/control", options)


def stats(url: str) -> dict[str, Any]:
    return _call(f"{url}/stats")


def reset(url: str) -> None:
    """Zero the counters and clear the strict windows' logs."""
    _call(f"{url}/stats/reset", {})


def start_strict(
    procs: Processes, name: str, rpm: int, tpm: int | None, window: float, quantum: float | None
) -> str:
    """A fake upstream of its own enforcing ``rpm`` (and ``tpm``) per ``window`` seconds,
    and pro rata over every ``quantum`` seconds if set: its URL."""
    port = free_port()
    argv = [
        sys.executable, "-m", "proxy.fake_upstream", "--host", LOOPBACK, "--port", str(port),
        "--log-level", "WARNING", "--rpm", str(rpm), "--window", f"{window:g}",
        "--chunk-delay", "0",
    ]  # fmt: skip
    if tpm is not None:
        argv += ["--tpm", str(tpm)]
    if quantum is not None:
        argv += ["--quantum", f"{quantum:g}"]
    process = procs.start(name, argv)
    url = f"http://{LOOPBACK}:{port}"
    wait_until(f"{url}/stats", process, timeout=20)
    return url
