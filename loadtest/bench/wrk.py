"""Running wrk: its command, its figures (printed by bench_chat.lua), paired slices."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

from loadtest.bench.model import CHAT_PATH, MODEL, PAIRS, Run

LUA_SCRIPT = Path(__file__).resolve().parent.parent / "bench_chat.lua"
API_KEY = "sk-bench-client"


def parse_wrk(output: str, connections: int) -> Run:
    """The JSON line bench_chat.lua prints at the end of a wrk run."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith('{"requests"')), None)
    if line is None:
        raise RuntimeError(f"no figures in wrk's output:\n{output[-2000:]}")
    data = json.loads(line)
    return Run(
        connections=connections,
        requests=int(data["requests"]),
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=sum(
            int(data[k]) for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
        ),
        non_2xx=int(data["non_2xx"]),
    )


def wrk_command(url: str, connections: int, duration: float, path: str = CHAT_PATH) -> list[str]:
    return [
        "wrk",
        "-t1",  # one thread: the 2-core machine needs the other cycles for the servers
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout", "10s",
        "-s", str(LUA_SCRIPT),
        url + path,
    ]  # fmt: skip


def run_wrk(
    url: str, connections: int, duration: float, path: str = CHAT_PATH, model: str = MODEL
) -> Run:
    """``path`` and ``model``: the chat route and model name of the server at ``url`` (the
    peer's differ from ours); the body is otherwise the same for every target."""
    env = {**os.environ, "BENCH_API_KEY": API_KEY, "BENCH_MODEL": model}
    done = subprocess.run(
        wrk_command(url, connections, duration, path),
        capture_output=True,
        text=True,
        env=env,
        timeout=duration + 30,
        check=True,
    )
    return parse_wrk(done.stdout, connections)


def paired_run(
    url: str, direct_url: str, duration: float, path: str = CHAT_PATH, model: str = MODEL
) -> tuple[Run, float]:
    """One connection through the proxy in PAIRS slices, each right after a direct slice:
    the proxy's figures are the median slice's, the added latency the median difference."""
    direct: list[Run] = []
    proxied: list[Run] = []
    for _ in range(PAIRS):
        direct.append(run_wrk(direct_url, 1, duration / PAIRS))
        proxied.append(run_wrk(url, 1, duration / PAIRS, path, model))
    added = statistics.median(p.p50_ms - d.p50_ms for p, d in zip(proxied, direct, strict=True))
    run = Run(
        connections=1,
        requests=sum(r.requests for r in proxied),
        seconds=sum(r.seconds for r in proxied),
        p50_ms=statistics.median(r.p50_ms for r in proxied),
        p90_ms=statistics.median(r.p90_ms for r in proxied),
        p99_ms=statistics.median(r.p99_ms for r in proxied),
        errors=sum(r.errors for r in proxied),
        non_2xx=sum(r.non_2xx for r in proxied),
    )
    return run, added
