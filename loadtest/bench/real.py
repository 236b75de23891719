"""The real-traffic rows: 2 replicas of the proxy on one Redis in front of the fake
upstream, wrk (bench_traffic.lua, a thread per replica) drawing each request's key, model
and streaming, measured in rounds beside the same traffic sent to the fake upstream
directly (``rounds.py``); with a baseline revision, its replicas too, in the same rounds.

Rows (``ROWS``, by slug): ``real`` (1,000 keys, the upstream answering at once: the
proxy's own cost; req/s and CPU per request at 64 and 256 connections, added p50 and p99
at 1 connection), ``real-latency`` (the same replicas, the upstream answering as a model
does: added p50 and p99 at 64 and 256 connections), ``100k-keys`` (100,000 keys: start
to ready, RSS, req/s at 64 and 256 connections)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.bench import traffic, upstreams
from loadtest.bench.otlp_sink import report as report_traces
from loadtest.bench.otlp_sink import with_traces
from loadtest.bench.replicas import Replica, start_replicas, stop_replicas
from loadtest.bench.rounds import Rounds, Side, Slot, measure
from loadtest.bench.servers import Processes, flush_redis
from loadtest.bench.wrk import run_traffic

REPLICAS = 2
PROXY, DIRECT, BEFORE = "proxy", "direct", "before"


@dataclass(frozen=True)
class Row:
    slug: str
    label: str
    shape: traffic.Shape
    upstream: dict[str, float]  # the fake upstream's options (upstreams.INSTANT, ...)
    plan: tuple[Slot, ...]  # the slices of a round, without a baseline
    # With a baseline, these slices of it join each round.
    baseline_plan: tuple[Slot, ...] = ()


ROWS = (
    Row(
        "real", "1,000 keys, upstream at 0 ms", traffic.REAL, upstreams.INSTANT,
        ((PROXY, 64), (PROXY, 256), (DIRECT, 1), (PROXY, 1)),
        ((BEFORE, 64), (BEFORE, 256), (BEFORE, 1)),
    ),
    Row(
        "real-latency", "1,000 keys, upstream at a model's latency", traffic.REAL,
        upstreams.MODEL_LATENCY,
        ((PROXY, 64), (DIRECT, 64), (PROXY, 256), (DIRECT, 256)),
        ((BEFORE, 64), (BEFORE, 256)),
    ),
    Row(
        "100k-keys", "100,000 keys, upstream at 0 ms", traffic.MANY_KEYS, upstreams.INSTANT,
        ((PROXY, 64), (PROXY, 256)),
        ((BEFORE, 64), (BEFORE, 256)),
    ),
)  # fmt: skip
BY_SLUG = {row.slug: row for row in ROWS}


@dataclass
class RowResult:
    row: Row
    rounds: Rounds
    ready_s: list[float] = field(default_factory=list)  # each replica's start to ready
    rss_mb: list[float] = field(default_factory=list)  # each replica, idle after start
    rss_after_mb: list[float] = field(default_factory=list)  # each replica, after the rounds
    baseline: str | None = None
    baseline_ready_s: list[float] = field(default_factory=list)


def slice_seconds(duration: float) -> dict[int, float]:
    """A slice's length by connections: half a row's ``--duration`` under load, a
    quarter at 1 connection (where the direct slice comes right before)."""
    return {1: duration / 4, 64: duration / 2, 256: duration / 2}


def row_plan(row: Row, baseline: bool) -> list[Slot]:
    """The slices of one round; a baseline's beside the work tree's."""
    if not baseline:
        return list(row.plan)
    found: list[Slot] = []
    for slot in row.plan:
        before = (BEFORE, slot[1])
        if slot[0] == PROXY and before in row.baseline_plan and before not in found:
            found.append(before)
        found.append(slot)
    return found


def _side(name: str, replicas: list[Replica], shape: traffic.Shape) -> Side:
    ports = [r.port for r in replicas]
    return Side(
        name,
        replicas[0].url,
        traffic.wrk_env(shape, ports),
        tuple(r.process.pid for r in replicas),
        threads=len(replicas),
    )


@dataclass
class Stack:
    """The replicas that serve one shape (kept for the rows that share it)."""

    shape: traffic.Shape
    now: list[Replica]
    before: list[Replica] = field(default_factory=list)


def start_stack(
    procs: Processes,
    shape: traffic.Shape,
    upstream_url: str,
    redis_url: str,
    baseline: Path | None,
    log: Callable[[str], None],
    baseline_env: dict[str, str] | None = None,
) -> Stack:
    """The work tree's replicas (Redis database 0) and the baseline's (database 1): the
    code of another revision, or with ``baseline_env`` (a fast path off) the work tree's."""
    upstreams_by_group = {g.model: [upstream_url] for g in shape.groups}
    flush_redis(redis_url)
    log(f"{shape.describe()}: starting {REPLICAS} replicas")
    config = traffic.proxy_config(shape, upstreams_by_group, redis_url)
    # BENCH_TRACES=1: this tree's replicas trace every request (otlp_sink.py).
    now = start_replicas(procs, f"{shape.name}-now", with_traces(procs, config), REPLICAS)
    before: list[Replica] = []
    if baseline is not None:
        before_redis = redis_url.rsplit("/", 1)[0] + "/1"
        try:
            before = start_replicas(
                procs, f"{shape.name}-before",
                traffic.proxy_config(shape, upstreams_by_group, before_redis), REPLICAS, baseline,
                extra_env=baseline_env,
            )  # fmt: skip
        except BaseException:
            stop_replicas(procs, now)
            raise
    return Stack(shape, now, before)


def run_row(
    row: Row,
    stack: Stack,
    procs: Processes,
    upstream_url: str,
    rounds: int,
    duration: float,
    warmup: float,
    log: Callable[[str], None],
    baseline: str | None = None,
) -> RowResult:
    """One row's rounds on a running ``stack``."""
    upstreams.control(upstream_url, **row.upstream)
    sides = {
        PROXY: _side(PROXY, stack.now, row.shape),
        DIRECT: traffic_direct(upstream_url, row.shape),
    }
    if stack.before:
        sides[BEFORE] = _side(BEFORE, stack.before, row.shape)
    result = RowResult(
        row,
        Rounds(),
        ready_s=[r.ready_s for r in stack.now],
        rss_mb=[r.rss_mb() for r in stack.now],
        baseline=baseline if stack.before else None,
        baseline_ready_s=[r.ready_s for r in stack.before],
    )
    log(f"{row.label}: warming up {warmup:g} s a side")
    for name in (PROXY, BEFORE):
        if name in sides:
            side = sides[name]
            run_traffic(side.url, 64, warmup, side.env, side.threads)
    redis = procs.named.get("redis")
    result.rounds = measure(
        sides,
        row_plan(row, bool(stack.before)),
        rounds,
        slice_seconds(duration),
        log,
        redis_pid=None if redis is None else redis.pid,
        name=row.slug,
    )
    result.rss_after_mb = [r.rss_mb() for r in stack.now]
    report_traces(procs, log)
    return result


def traffic_direct(upstream_url: str, shape: traffic.Shape) -> Side:
    """The same traffic straight to the fake upstream (one thread, no replicas)."""
    return Side(DIRECT, upstream_url, traffic.wrk_env(shape))


def stop_stack(procs: Processes, stack: Stack) -> None:
    stop_replicas(procs, stack.now)
    stop_replicas(procs, stack.before)


def restore_upstream(upstream_url: str) -> None:
    """The fake upstream as the one-key rows expect it (its start-up defaults)."""
    upstreams.control(upstream_url, **upstreams.DEFAULTS)
