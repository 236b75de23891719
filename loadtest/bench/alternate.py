"""Before and after, alternated: the proxy as of a baseline revision and the work tree's,
both running at once, measured in turns (A B, B A, A B...) so the machine's drift falls on
both alike, and compared round by round.

One run of each is at the mercy of whatever else the (virtual) machine does in those ten
seconds; the rounds give the spread, which is the noise a difference must exceed to
count. Besides req/s at 64 connections and the median latency at 1 connection, each round
reads the proxy's CPU time per request from ``/proc`` (its own work, whatever the
scheduler did to wrk or the fake upstream): the steadiest of the three.

The peer comparison (``compare_with_peer``) runs the same turns between the peer gateway
and one of our targets (each of model.COMPARED: the default config, the headline, and the
bench's large-burst config): its ratio of req/s is ours over the peer's, and each
turn's 1-connection slice comes right after a direct one, for the added latency of each.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from loadtest.bench.model import PEER, Alternation, Round, Target, Turn
from loadtest.bench.servers import Processes, cpu_seconds, start_proxy, start_server
from loadtest.bench.wrk import run_wrk

Started = tuple[Target, subprocess.Popen[bytes], str]  # a running server and its URL


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
    before = start_proxy(before_target, procs, upstream_url, before_redis, sources, "ab-before")
    try:
        now = start_proxy(target, procs, upstream_url, redis_url, sources, "ab-now")
    except BaseException:
        procs.stop(before[0])
        raise
    started = [(before_target, before[0], before[1]), (target, now[0], now[1])]
    try:
        turns = in_turns(started, rounds, duration, log, f"  {target.label}")
    finally:
        for _, process, _ in started:
            procs.stop(process)
    return Alternation(target, baseline, turns)


def compare_with_peer(
    ours_target: Target,
    peer_target: Target,
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    rounds: int,
    duration: float,
    log: Callable[[str], None],
) -> Alternation:
    """The peer (``peer_target``: PEER with its rule, ``before``) and ``ours_target``
    (``now``), in turns as above, each turn's 1-connection slice right after a direct one
    (its added latency). Raises servers.PeerUnavailable if the peer does not start."""
    ours = start_server(ours_target, procs, upstream_url, redis_url, name="peer-ours")
    try:
        theirs = start_server(peer_target, procs, upstream_url, redis_url, name="peer-theirs")
    except BaseException:
        procs.stop(ours[0])
        raise
    started = [(peer_target, theirs[0], theirs[1]), (ours_target, ours[0], ours[1])]
    try:
        redis = procs.named.get("redis")
        turns = in_turns(
            started, rounds, duration, log, f"  peer vs {ours_target.slug}",
            direct_url=upstream_url,
            redis_pid=None if redis is None else redis.pid,
        )  # fmt: skip
    finally:
        for _, process, _ in started:
            procs.stop(process)
    return Alternation(ours_target, PEER.label, turns)


def in_turns(
    started: list[Started],
    rounds: int,
    duration: float,
    log: Callable[[str], None],
    name: str,
    direct_url: str | None = None,
    redis_pid: int | None = None,
) -> list[Round]:
    """Two running servers (before, now) measured in turns: A B, B A, ... With
    ``direct_url``, each 1-connection slice follows a direct one (``Turn.added_ms``);
    with ``redis_pid``, the redis-server's CPU per request is read too (``Turn.redis_us``)."""
    for target, _, url in started:
        run_wrk(url, 64, 2.0, target.path, target.model)  # warm-up
    result = []
    for i in range(rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        turns: dict[int, Turn] = {}
        for side in order:
            target, process, url = started[side]
            cpu = cpu_seconds(process.pid)
            redis_cpu = cpu_seconds(redis_pid) if redis_pid else 0.0
            loaded = run_wrk(url, 64, duration, target.path, target.model)
            cpu = cpu_seconds(process.pid) - cpu
            redis_cpu = cpu_seconds(redis_pid) - redis_cpu if redis_pid else 0.0
            direct = run_wrk(direct_url, 1, duration / 2) if direct_url else None
            single = run_wrk(url, 1, duration / 2, target.path, target.model)
            per_request = cpu / loaded.requests * 1e6 if loaded.requests else 0.0
            added = single.p50_ms - direct.p50_ms if direct else None
            redis_us = redis_cpu / loaded.requests * 1e6 if redis_pid and loaded.requests else None
            turns[side] = Turn(loaded.rps, per_request, single.p50_ms, added, redis_us)
        result.append(Round(turns[0], turns[1]))
        a, b = turns[0], turns[1]
        log(
            f"{name} round {i + 1}: req/s {a.rps:.0f} -> {b.rps:.0f},"
            f" CPU/request {a.cpu_us:.0f} -> {b.cpu_us:.0f} us,"
            f" p50@1 {a.p50_ms:.2f} -> {b.p50_ms:.2f} ms"
            + (f" (added {a.added_ms:+.2f} -> {b.added_ms:+.2f})" if direct_url else "")
            + (
                f", Redis CPU/request {a.redis_us:.0f} -> {b.redis_us:.0f} us"
                if a.redis_us is not None and b.redis_us is not None
                else ""
            )
        )
    return result
