"""Before and after, alternated: the proxy as of a baseline revision and the work tree's,
both running at once, measured in turns (A B, B A, A B...) so the machine's drift falls on
both alike, and compared round by round.

One run of each is at the mercy of whatever else the (virtual) machine does in those ten
seconds, so each round's turns are cut into ``SLICES`` slices that alternate (A B, B A, ...
within the round); the rounds give the spread, which is the noise a difference must
exceed to count (``python -m loadtest.noise`` measures it between identical proxies).
Besides req/s at 64 connections and the median latency at 1 connection, each round reads
the proxy's CPU time per request from ``/proc`` (its own work, whatever the scheduler did
to wrk or the fake upstream): the steadiest of the three.

The peer comparison (``compare_with_peer``) runs the same turns between the peer gateway
and one of our targets (each of model.COMPARED: the default config, the headline, and the
bench's large-burst config): its ratio of req/s is ours over the peer's, and each
turn's 1-connection slice comes right after a direct one, for the added latency of each.
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.bench.model import PEER, SLICES, Alternation, Round, Target, Turn
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


@dataclass
class _Tally:
    """One side's slices of a round, summed into its ``Turn``."""

    requests: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    redis_cpu: float = 0.0
    p50s: list[float] = field(default_factory=list)
    added: list[float] = field(default_factory=list)

    def turn(self, redis_measured: bool) -> Turn:
        per_request = self.cpu / self.requests * 1e6 if self.requests else 0.0
        redis_us = (
            self.redis_cpu / self.requests * 1e6 if redis_measured and self.requests else None
        )
        return Turn(
            self.requests / self.seconds if self.seconds else 0.0,
            per_request,
            statistics.median(self.p50s),
            statistics.median(self.added) if self.added else None,
            redis_us,
        )


def in_turns(
    started: list[Started],
    rounds: int,
    duration: float,
    log: Callable[[str], None],
    name: str,
    direct_url: str | None = None,
    redis_pid: int | None = None,
) -> list[Round]:
    """Two running servers (before, now) measured in turns: in each round, ``SLICES``
    slices of ``duration`` seconds in all at 64 connections, A B, B A, ..., then as many
    of half that at 1 connection. With ``direct_url``, each 1-connection slice follows a
    direct one (``Turn.added_ms``: the median difference); with ``redis_pid``, the
    redis-server's CPU per request is read too (``Turn.redis_us``)."""
    for target, _, url in started:
        run_wrk(url, 64, 2.0, target.path, target.model)  # warm-up
    result = []
    for i in range(rounds):
        tallies = [_Tally(), _Tally()]
        for k in range(SLICES):
            order = (0, 1) if (i + k) % 2 == 0 else (1, 0)
            for side in order:
                target, process, url = started[side]
                tally = tallies[side]
                cpu = cpu_seconds(process.pid)
                redis_cpu = cpu_seconds(redis_pid) if redis_pid else 0.0
                loaded = run_wrk(url, 64, duration / SLICES, target.path, target.model)
                tally.cpu += cpu_seconds(process.pid) - cpu
                tally.redis_cpu += cpu_seconds(redis_pid) - redis_cpu if redis_pid else 0.0
                tally.requests += loaded.requests
                tally.seconds += loaded.seconds
            for side in order:
                target, _, url = started[side]
                direct = run_wrk(direct_url, 1, duration / 2 / SLICES) if direct_url else None
                single = run_wrk(url, 1, duration / 2 / SLICES, target.path, target.model)
                tallies[side].p50s.append(single.p50_ms)
                if direct is not None:
                    tallies[side].added.append(single.p50_ms - direct.p50_ms)
        a, b = (tally.turn(redis_pid is not None) for tally in tallies)
        result.append(Round(a, b))
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
