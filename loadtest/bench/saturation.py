"""The saturated row: demand about twice what a model group's strict upstreams allow.

One group of ``DEPLOYMENTS`` OpenAI deployments, each its own fake upstream enforcing
``STRICT_RPM`` requests (and ``STRICT_TPM`` tokens) per 60 s and pro rata over every
second (OpenAI's "quantized" limits: a 429 beyond either); 8 client keys of equal
weight with a 1 s ``max_wait`` of their own, no limits of their own; 2 replicas on one
Redis. wrk gives each key a thread per replica, each connection pausing an exponential
time before each request so that, were no request made to wait, the keys would send
``DEMAND`` times the group's limit, the 4 heavy keys twice as much as the 4 light ones
(light keys too ask more than their fair share, an eighth of the limit each).

Measured per round, from the fake upstreams' counters (``/stats``) over the saturated
span (from ``RAMP`` seconds after the start, once the demand has built up): the share
of the limit used (served over limit x span), the upstream's 429s over the whole round;
from wrk: the offered rate over the limit, the client-side latency percentiles, answers
by status, and each key's 200s: the fair share is the least over the most among these
keys of equal weight (1 if the turns are split evenly; first come, first served would
give the light keys half the heavy ones': 0.5).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.bench import traffic, upstreams
from loadtest.bench.model import Run
from loadtest.bench.replicas import start_replicas, stop_replicas
from loadtest.bench.servers import Processes, flush_redis
from loadtest.bench.wrk import finish_traffic, start_traffic

DEPLOYMENTS = 3
STRICT_RPM = 600  # 10 a second, OpenAI's tier 1 is 500 a minute
STRICT_TPM = 60_000
WINDOW = 60.0
QUANTUM = 1.0
KEYS = 8
HEAVY = 4  # keys 0-3 send twice as much as keys 4-7
HEAVY_DRAW = 2
DEMAND = 3.5  # if no request waited: waits (up to 1 s) bring it to about 2x, measured
CONNECTIONS = 128
REPLICAS = 2
RAMP = 3.0

SHAPE = traffic.Shape(
    "saturated",
    keys=KEYS,
    groups=(traffic.Group("gpt-4o", "openai", "chat", DEPLOYMENTS, STRICT_RPM, STRICT_TPM),),
    stream_percent=20,
    tiers=(traffic.Tier("unlimited", rpm=1_000_000, tpm=1_000_000_000),),
    weight=1,
    key_max_wait="1s",
)
LIMIT_RPS = DEPLOYMENTS * STRICT_RPM / WINDOW


def describe() -> str:
    return (
        f"{KEYS} keys of equal weight ({HEAVY} sending {HEAVY_DRAW}x as much as the others),"
        f" {DEPLOYMENTS} deployments at {STRICT_RPM:,} rpm each, strict (a fake upstream each,"
        f" a 429 beyond {STRICT_RPM} in any {WINDOW:g} s or {STRICT_RPM / WINDOW * QUANTUM:g}"
        f" in any {QUANTUM:g} s), clients that would send {DEMAND:g}x the limit were no"
        f" request made to wait (about 2x as they wait), {SHAPE.stream_percent}% streamed,"
        f" {REPLICAS} replicas on one Redis"
    )


def thread_plan(
    keys: int = KEYS,
    heavy: int = HEAVY,
    heavy_draw: int = HEAVY_DRAW,
    replicas: int = REPLICAS,
    connections: int = CONNECTIONS,
    limit_rps: float = LIMIT_RPS,
    demand: float = DEMAND,
) -> tuple[list[int], list[float]]:
    """Each wrk thread's key (a thread per key and replica, key by key) and its mean
    pause before a request, in ms, so that the threads together would send ``demand``
    times ``limit_rps`` if every answer came at once. *pure*"""
    weights = [heavy_draw if k < heavy else 1 for k in range(keys)]
    per_thread = connections // (keys * replicas)
    found_keys: list[int] = []
    delays: list[float] = []
    for key, weight in enumerate(weights):
        rate = demand * limit_rps * weight / sum(weights) / replicas  # a thread's req/s
        for _ in range(replicas):
            found_keys.append(key)
            delays.append(per_thread / rate * 1000)
    return found_keys, delays


def fair_share(per_key: dict[int, int]) -> float | None:
    """The least over the most of the keys' served counts. *pure*"""
    if not per_key or not max(per_key.values()):
        return None
    return min(per_key.values()) / max(per_key.values())


@dataclass(frozen=True)
class SaturationRound:
    run: Run
    span_s: float  # the saturated span the upstream counts are over
    served: int  # by the upstreams, over the span
    upstream_429: int  # over the whole round
    ok: int
    refused: int
    other: int
    per_key: dict[int, int] = field(default_factory=dict)  # 200s by key

    @property
    def used(self) -> float:
        return self.served / (LIMIT_RPS * self.span_s) if self.span_s else 0.0

    @property
    def demand(self) -> float:
        return self.run.rps / LIMIT_RPS

    @property
    def fair(self) -> float | None:
        return fair_share(self.per_key)

    @property
    def heavy_over_light(self) -> float | None:
        heavy = [n for k, n in self.per_key.items() if k < HEAVY]
        light = [n for k, n in self.per_key.items() if k >= HEAVY]
        if not heavy or not light or not sum(light):
            return None
        return (sum(heavy) / len(heavy)) / (sum(light) / len(light))


@dataclass
class SaturationResult:
    rounds: list[SaturationRound] = field(default_factory=list)
    baseline: str | None = None


def _served(urls: list[str]) -> tuple[int, int]:
    found = [upstreams.stats(url) for url in urls]
    return sum(s["served"] for s in found), sum(s["rejected"] for s in found)


def run_saturation(
    procs: Processes,
    redis_url: str,
    rounds: int,
    seconds: float,
    log: Callable[[str], None],
) -> SaturationResult:
    """``rounds`` rounds of ``seconds`` (at least RAMP + 2) on fresh strict upstreams."""
    urls = [
        upstreams.start_strict(procs, f"strict-{i + 1}", STRICT_RPM, STRICT_TPM, WINDOW, QUANTUM)
        for i in range(DEPLOYMENTS)
    ]
    flush_redis(redis_url)
    settings = traffic.proxy_config(SHAPE, {g.model: urls for g in SHAPE.groups}, redis_url)
    log(f"saturated: {describe()}")
    replicas = start_replicas(procs, "saturated", settings, REPLICAS)
    keys, delays = thread_plan()
    env = {
        **traffic.wrk_env(SHAPE, [r.port for r in replicas]),
        "BENCH_THREAD_KEYS": ",".join(str(k) for k in keys),
        "BENCH_THREAD_DELAYS_MS": ",".join(f"{d:.0f}" for d in delays),
    }
    seconds = max(seconds, RAMP + 2)
    result = SaturationResult()
    try:
        for i in range(rounds):
            for url in urls:
                upstreams.reset(url)
            wrk = start_traffic(replicas[0].url, CONNECTIONS, seconds, env, len(keys))
            time.sleep(RAMP)
            served_before, _ = _served(urls)
            ramped = time.monotonic()
            run, threads = finish_traffic(wrk, CONNECTIONS, seconds + 30)
            span = time.monotonic() - ramped
            served_after, rejected = _served(urls)
            per_key: dict[int, int] = {}
            for thread in threads:
                per_key[thread["key"]] = per_key.get(thread["key"], 0) + thread["ok"]
            found = SaturationRound(
                run,
                span,
                served_after - served_before,
                rejected,
                sum(t["ok"] for t in threads),
                sum(t["refused"] for t in threads),
                sum(t["other"] for t in threads),
                per_key,
            )
            result.rounds.append(found)
            log(
                f"  saturated round {i + 1}: demand {found.demand:.2f}x, used {found.used:.1%}"
                f" of the limit, upstream 429s {found.upstream_429}, 200/429/other"
                f" {found.ok}/{found.refused}/{found.other}, p50 {run.p50_ms:.0f} p99"
                f" {run.p99_ms:.0f} ms, fair share {_opt(found.fair)}, heavy/light"
                f" {_opt(found.heavy_over_light)}"
            )
            time.sleep(1.0)  # the abandoned waits of the round's end leave
    finally:
        stop_replicas(procs, replicas)
        for i in range(DEPLOYMENTS):
            process = procs.named.get(f"strict-{i + 1}")
            if process is not None:
                procs.stop(process)
    return result


def _opt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
