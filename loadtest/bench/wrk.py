"""Running wrk: its command, its figures (printed by bench_chat.lua), paired slices."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

from loadtest.bench.model import CHAT_PATH, MODEL, PAIRS, Run

LUA_SCRIPT = Path(__file__).resolve().parent.parent / "bench_chat.lua"
TRAFFIC_SCRIPT = LUA_SCRIPT.with_name("bench_traffic.lua")  # real traffic (traffic.py)
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


def wrk_command(
    url: str,
    connections: int,
    duration: float,
    path: str = CHAT_PATH,
    script: Path = LUA_SCRIPT,
    threads: int = 1,
) -> list[str]:
    return [
        "wrk",
        # One thread (one per replica with real traffic): the 2-core machine needs the
        # other cycles for the servers.
        f"-t{threads}",
        f"-c{max(connections, threads)}",
        f"-d{max(1, round(duration))}s",
        "--timeout", "10s",
        "-s", str(script),
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


def thread_counts(output: str) -> list[dict[str, int]]:
    """bench_traffic.lua's per-thread answers by status (saturation: a key per thread)."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith('{"requests"')), None)
    return [] if line is None else list(json.loads(line).get("threads", []))


def start_traffic(
    url: str, connections: int, duration: float, env: dict[str, str], threads: int = 1
) -> subprocess.Popen[str]:
    """bench_traffic.lua at ``url`` with ``threads`` threads (one per replica port named
    in ``env``), running: ``finish_traffic`` reads it."""
    return subprocess.Popen(
        wrk_command(url, connections, duration, "/", TRAFFIC_SCRIPT, threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def finish_traffic(
    process: subprocess.Popen[str], connections: int, timeout: float
) -> tuple[Run, list[dict[str, int]]]:
    """The run's figures and, if it counts them, each thread's answers."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"wrk exited with {process.returncode}: {err[-2000:]}")
    return parse_wrk(out, connections), thread_counts(out)


def run_traffic(
    url: str, connections: int, duration: float, env: dict[str, str], threads: int = 1
) -> tuple[Run, list[dict[str, int]]]:
    """``start_traffic`` and ``finish_traffic``: wrk's run, done."""
    process = start_traffic(url, connections, duration, env, threads)
    return finish_traffic(process, max(connections, threads), duration + 30)


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
