"""Before and after, alternated: the proxy as of a baseline revision and the work tree's,
both running at once, measured in turns (A B, B A, A B...) so the machine's drift falls on
both alike, and compared round by round.

One run of each is at the mercy of whatever else the (virtual) machine does in those ten
seconds; the rounds give the spread, which is the noise a difference must exceed to
count. Besides req/s at 64 connections and the median latency at 1 connection, each round
reads the proxy's CPU time per request from ``/proc`` (its own work, whatever the
scheduler did to wrk or the fake upstream): the steadiest of the three.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loadtest.bench.model import Alternation, Round, Target, Turn
from loadtest.bench.servers import Processes, cpu_seconds, start_proxy
from loadtest.bench.wrk import run_wrk


def alternate(
    target: Target,
    baseline: str,
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    sources: dict[str, Path],
    rounds: int,
    duration: float,
    log: Callable[[str], None],
) -> Alternation:
    """``rounds`` rounds of ``duration`` seconds at 64 connections and half that at 1,
    each version in turn; the two proxies use different Redis databases."""
    assert target.backend is not None
    before_target = target.at(baseline)
    before_redis = redis_url.rsplit("/", 1)[0] + "/1"
    started = [
        start_proxy(before_target, procs, upstream_url, before_redis, sources, "ab-before"),
        start_proxy(target, procs, upstream_url, redis_url, sources, "ab-now"),
    ]
    result = Alternation(target, baseline)
    try:
        for _, url, _ in started:
            run_wrk(url, 64, 2.0)  # warm-up
        for i in range(rounds):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            turns: dict[int, Turn] = {}
            for side in order:
                process, url, _ = started[side]
                cpu = cpu_seconds(process.pid)
                loaded = run_wrk(url, 64, duration)
                cpu = cpu_seconds(process.pid) - cpu
                single = run_wrk(url, 1, duration / 2)
                per_request = cpu / loaded.requests * 1e6 if loaded.requests else 0.0
                turns[side] = Turn(loaded.rps, per_request, single.p50_ms)
            result.rounds.append(Round(turns[0], turns[1]))
            log(
                f"  {target.label} round {i + 1}: req/s {turns[0].rps:.0f} -> {turns[1].rps:.0f},"
                f" CPU/request {turns[0].cpu_us:.0f} -> {turns[1].cpu_us:.0f} us,"
                f" p50@1 {turns[0].p50_ms:.2f} -> {turns[1].p50_ms:.2f} ms"
            )
    finally:
        for process, _, _ in started:
            procs.stop(process)
    return result
