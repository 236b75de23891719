"""Property: the Lua scripts do exactly the pure core's math.

Random sequences of every limiter operation (key acquire and settlement with several
windows of requests and tokens, from under a second to thirty days, and max_parallel;
multi-candidate deployment reservations over several windows each, with leases and
least_busy; corrections; settlements with every kind of outcome and what the upstream
says it has left; snapshots of deployments and keys, the reads) at nondecreasing times
are applied in lockstep to the memory backend (the pure core and pure health model over
dicts) and to the Redis backend (the Lua scripts), both on the same explicit clock. Every
answer must be identical: exact float equality, no tolerance.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.limits import RULE, Clock, patient

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    Claimant,
    CooldownRule,
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    Kind,
    Outcome,
    Private,
    Rate,
    Remaining,
    Sent,
    Window,
    window_name,
)
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.redis.backend import RedisLimiter

amounts = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 10.0, 50.0]),
    st.floats(min_value=0.0, max_value=80.0, allow_nan=False, allow_infinity=False),
)
limits = st.one_of(
    st.sampled_from([1.0, 3.0, 7.0, 50.0]),
    st.floats(min_value=0.5, max_value=100.0, allow_nan=False, allow_infinity=False),
)
capacities = st.one_of(
    st.sampled_from([1.0, 2.0, 5.0, 50.0]),
    st.floats(min_value=0.5, max_value=60.0, allow_nan=False, allow_infinity=False),
)
# Paced buckets (a request up to the ceiling goes alone once drained) now and then.
ceilings = st.one_of(st.none(), st.none(), st.sampled_from([10.0, 100.0]), limits)
# Intervals from ~10 ms to a minute, so that time advancing a few seconds sometimes
# drains a bucket fully and often only partly; and day and 30-day windows.
PERIODS = [1.0, 60.0, 0.7, 3.0, 86400.0, 2592000.0]
rates = st.builds(
    Rate,
    limit=limits,
    period=st.sampled_from(PERIODS[:4]),
    capacity=capacities,
    ceiling=ceilings,
)


def _window(kind: Kind, rate: Rate) -> Window:
    return Window(window_name(kind, rate.period), kind, rate)


def _distinct(windows: tuple[Window | None, ...]) -> tuple[Window, ...]:
    """The first window of each name (a name is a kind and a period)."""
    named: dict[str, Window] = {}
    for w in windows:
        if w is not None:
            named.setdefault(w.name, w)
    return tuple(named.values())


window_sets = st.lists(
    st.tuples(
        st.sampled_from(["requests", "tokens"]),
        st.builds(
            Rate,
            limit=limits,
            period=st.sampled_from(PERIODS),
            capacity=capacities,
            ceiling=ceilings,
        ),
    ),
    max_size=3,
    unique_by=lambda kr: (kr[0], kr[1].period),  # a window is named by kind and period
).map(lambda pairs: tuple(_window(k, r) for k, r in pairs))  # type: ignore[arg-type]
parallel = st.one_of(st.none(), st.integers(min_value=1, max_value=3))
# A key alone or in a team (another owner of windows and slots, checked in the same step).
teams = st.builds(
    KeyLimits, name=st.just("t"), windows=window_sets, max_parallel=parallel, scope=st.just("team")
)
keys = st.builds(
    KeyLimits,
    name=st.sampled_from(["k"]),
    windows=window_sets,
    max_parallel=parallel,
    team=st.one_of(st.none(), st.none(), teams),
)
probe_timeouts = st.sampled_from([0.5, 5.0, 60.0])
deployments = st.lists(
    st.builds(DeploymentLimits, id=st.just(""), windows=window_sets, probe_timeout=probe_timeouts),
    min_size=1,
    max_size=3,
)


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Acquire:
    tokens: float
    lease: int


@dataclass(frozen=True)
class Release:
    lease: int
    correction: float


@dataclass(frozen=True)
class Reserve:
    order: tuple[int, ...]  # candidate indices, in preference order
    tokens: float
    max_wait: float


@dataclass(frozen=True)
class FairReserve:
    """A reservation for a client key, with fair share on (fairness.py)."""

    order: tuple[int, ...]
    tokens: float
    max_wait: float
    claimant: Claimant
    lookahead: float


@dataclass(frozen=True)
class Correct:
    """A settlement that only corrects (a turn given back, a token estimate) or holds
    the pacing windows (a share carried over after a storage outage)."""

    deployment: int
    requests: float
    tokens: float
    hold: float = 0.0


@dataclass(frozen=True)
class Book:
    """A reservation with an in-flight lease, least busy or not."""

    order: tuple[int, ...]
    tokens: float
    max_wait: float
    lease: int  # -1: no lease
    least_busy: bool


@dataclass(frozen=True)
class Settle:
    deployment: int
    lease: int  # -1: no lease
    outcome: Outcome
    requests: float
    tokens: float
    # With the latest turn reserved on it (a 429 then learns from it), or with none.
    with_turn: bool = False


@dataclass(frozen=True)
class Sync:
    """A settlement with what the upstream says it has left."""

    deployment: int
    remaining: Remaining


@dataclass(frozen=True)
class Query:
    """A snapshot of every deployment: health, what is left in each window, next turn."""


@dataclass(frozen=True)
class KeyQuery:
    """A snapshot of the key: what is left in each window, slots held."""


Op = (
    Advance
    | Acquire
    | Release
    | Reserve
    | FairReserve
    | Correct
    | Book
    | Settle
    | Sync
    | Query
    | KeyQuery
)

holds = st.one_of(
    st.just(0.0),
    st.sampled_from([0.5, 3.0]),
    st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False),
)
corrections = st.one_of(
    st.sampled_from([0.0, -1.0, 1.0, -10.0, 5.5]),
    st.floats(min_value=-60.0, max_value=60.0, allow_nan=False, allow_infinity=False),
)
advances = st.builds(
    Advance,
    st.one_of(
        st.sampled_from([0.0, 0.01, 0.1, 0.7, 1.0, 1.2, 60.0]),
        st.floats(min_value=0.0, max_value=3.0, allow_nan=False, allow_infinity=False),
    ),
)
reserves = st.builds(
    Reserve,
    st.permutations([0, 1, 2]).map(tuple),
    amounts,
    st.one_of(st.sampled_from([0.0, 1.0, 30.0]), st.floats(0.0, 20.0, allow_nan=False)),
)
claimants = st.builds(
    Claimant,
    st.sampled_from(["a", "b", "c", ""]),
    st.sampled_from([0, 0, 1]),
    st.sampled_from([1.0, 1.0, 3.0, 0.5]),
)
fair_reserves = st.builds(
    FairReserve,
    st.permutations([0, 1, 2]).map(tuple),
    amounts,
    st.one_of(st.sampled_from([0.0, 1.0, 30.0]), st.floats(0.0, 20.0, allow_nan=False)),
    claimants,
    st.sampled_from([0.5, 1.0, 3.0]),
)
# Reservations weigh most: they exercise multi-bucket charging and the choice.
ops = st.one_of(
    fair_reserves,
    advances,
    advances,
    st.builds(Acquire, amounts, st.integers(0, 4)),
    st.builds(Release, st.integers(0, 4), corrections),
    st.just(KeyQuery()),
    reserves,
    reserves,
    reserves,
    st.builds(Correct, st.integers(0, 2), st.sampled_from([0.0, -1.0, 1.0]), corrections, holds),
)
start_times = st.sampled_from([0.0, 12345.678, 1_700_000_000.123456])


async def run_both(
    url: str,
    key: KeyLimits,
    deps: list[DeploymentLimits],
    start: float,
    sequence: list[Op],
    rule: CooldownRule = RULE,
) -> None:
    clock = Clock(start)
    memory = MemoryLimiter(clock)
    shared = patient(url, clock=clock, prefix=f"eq{uuid.uuid4().hex}")
    candidates = [replace(d, id=f"d{i}") for i, d in enumerate(deps)]
    turns: dict[str, Sent] = {}
    try:
        for step, op in enumerate(sequence):
            if isinstance(op, Advance):
                clock.now += op.seconds
            elif isinstance(op, Acquire):
                ask = KeyAsk(key, f"lease{op.lease}", estimate_cost(op.tokens))
                assert await shared.acquire_key(ask) == memory.acquire_key_now(ask), (step, op)
            elif isinstance(op, Release):
                settlement = KeySettlement(key, f"lease{op.lease}", {"tokens": op.correction})
                await shared.settle(settlement)
                memory.settle_now(settlement)
            elif isinstance(op, KeyQuery):
                assert await shared.key_snapshot(key) == memory.key_snapshot_now(key), (step, op)
                if key.team is not None:
                    team = key.team
                    assert await shared.key_snapshot(team) == memory.key_snapshot_now(team), step
            elif isinstance(op, Reserve | FairReserve):
                chosen = [candidates[i] for i in op.order if i < len(candidates)]
                group_ask = GroupAsk("g", chosen, estimate_cost(op.tokens), op.max_wait)
                if isinstance(op, FairReserve):
                    group_ask = replace(
                        group_ask, slot=f"r{step}", claimant=op.claimant, lookahead=op.lookahead
                    )
                got = await shared.reserve(group_ask)
                want = memory.reserve_now(group_ask)
                assert got == want, (step, op)
                if want.deployment_id is not None and want.sent is not None:
                    turns[want.deployment_id] = want.sent
            else:
                await run_health_op(shared, memory, candidates, rule, op, step, turns)
    finally:
        await shared.aclose()


def _kind(verdict: DeploymentVerdict) -> str:
    if verdict.deployment_id is None:
        return "cooling" if verdict.cooling else (verdict.code or "")
    return ("probe " if verdict.probe else "") + ("waits" if verdict.wait > 0 else "now")


def _lease(i: int) -> str:
    return "" if i < 0 else f"lease{i}"


async def run_health_op(
    shared: RedisLimiter,
    memory: MemoryLimiter,
    candidates: list[DeploymentLimits],
    rule: CooldownRule,
    op: Op,
    step: int,
    turns: dict[str, Sent],
) -> None:
    """One operation on both; ``turns`` keeps each deployment's latest reserved turn."""
    if isinstance(op, Correct | Settle | Sync):
        target = candidates[op.deployment % len(candidates)]
        if isinstance(op, Correct):
            settlement = DeploymentSettlement(
                "g",
                target,
                rule,
                cost={"requests": op.requests, "tokens": op.tokens},
                private=Private(hold=op.hold),
            )
        elif isinstance(op, Sync):
            settlement = DeploymentSettlement("g", target, rule, remaining=op.remaining)
        else:
            sent = turns.get(target.id) if op.with_turn else None
            settlement = DeploymentSettlement(
                "g",
                target,
                rule,
                op.outcome,
                _lease(op.lease),
                {"requests": op.requests, "tokens": op.tokens},
                sent=sent,
            )
        got_change = await shared.settle(settlement)
        want_change = memory.settle_now(settlement)
        learned = want_change.epoch > 0
        cooled, recovered = want_change.cooled, want_change.recovered
        event(f"settle: {cooled=} {recovered=} {learned=}")
        assert got_change == want_change, (step, op)
    elif isinstance(op, Book):
        chosen = [candidates[i] for i in op.order if i < len(candidates)] or candidates[:1]
        ask = GroupAsk(
            "g", chosen, estimate_cost(op.tokens), op.max_wait, _lease(op.lease), op.least_busy
        )
        got = await shared.reserve(ask)
        want = memory.reserve_now(ask)
        event(f"reserve: {_kind(want)}")  # --hypothesis-show-statistics shows coverage
        assert got == want, (step, op)
        if want.deployment_id is not None and want.sent is not None:
            turns[want.deployment_id] = want.sent
    elif isinstance(op, Query):
        got_states = await shared.snapshot("g", candidates)
        assert got_states == memory.snapshot_now("g", candidates), (step, op)


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=keys,
    deps=deployments,
    start=start_times,
    sequence=st.lists(ops, min_size=1, max_size=40),
)
def test_lua_matches_the_pure_core(
    redis_url: str,
    key: KeyLimits,
    deps: list[DeploymentLimits],
    start: float,
    sequence: list[Op],
) -> None:
    asyncio.run(run_both(redis_url, key, deps, start, sequence))


busy_deployment = st.builds(
    DeploymentLimits,
    id=st.just(""),
    windows=st.tuples(
        rates.map(lambda r: _window("requests", r)), rates.map(lambda r: _window("tokens", r))
    ),
).map(lambda d: [d])
small_reserves = st.builds(
    Reserve,
    st.just((0,)),
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 5.0, allow_nan=False)),
    st.one_of(st.sampled_from([0.0, 30.0]), st.floats(0.0, 20.0, allow_nan=False)),
)
fair_small_reserves = st.builds(
    FairReserve,
    st.just((0,)),
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 5.0, allow_nan=False)),
    st.one_of(st.sampled_from([0.0, 30.0]), st.floats(0.0, 20.0, allow_nan=False)),
    claimants,
    st.sampled_from([0.5, 1.0, 3.0]),
)
queueing_ops = st.one_of(
    advances,
    reserves,
    fair_small_reserves,
    fair_small_reserves,
    small_reserves,
    small_reserves,
    st.builds(Correct, st.just(0), st.sampled_from([0.0, -1.0]), corrections, holds),
    st.just(Query()),
)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    deps=busy_deployment,
    start=start_times,
    sequence=st.lists(queueing_ops, min_size=1, max_size=40),
)
def test_lua_matches_the_pure_core_on_one_queue(
    redis_url: str,
    deps: list[DeploymentLimits],
    start: float,
    sequence: list[Op],
) -> None:
    """One deployment limited by requests and tokens at once: turns queue up in both."""
    asyncio.run(run_both(redis_url, KeyLimits("k"), deps, start, sequence))


# What a lying upstream may send, were it not bounded before the limiter: both sides
# bound it alike (health.bounded_hold, rule.max_hold).
lies = st.sampled_from([math.inf, math.nan, 1e12, 1e30, -1.0, 86_400.0])
outcomes = st.one_of(
    st.just(Outcome("success")),
    st.just(Outcome("success")),
    st.just(Outcome("success")),
    st.just(Outcome("neutral")),
    st.just(Outcome("failure", "server_error")),
    st.builds(
        Outcome,
        st.just("failure"),
        st.just("rate_limited"),
        st.one_of(st.none(), st.sampled_from([0.0, 0.5, 2.0]), st.floats(0.0, 40.0), lies),
        st.just(True),
    ),
    st.builds(Outcome, st.just("failure"), st.just("auth"), st.floats(0.0, 40.0)),
)
leases = st.integers(-1, 3)
health_advances = st.one_of(
    advances,
    st.builds(Advance, st.sampled_from([0.0, 0.25, 0.5, 1.0])),
    st.builds(Advance, st.sampled_from([5.0, 30.0, 61.0, 500.0, 3700.0])),
)
books = st.builds(
    Book,
    st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True).map(tuple),
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([0.0, 1.0]), amounts),
    st.one_of(st.sampled_from([0.0, 1.0, 5.0, 30.0]), st.floats(0.0, 20.0, allow_nan=False)),
    leases,
    st.booleans(),
)
settles = st.builds(
    Settle,
    st.integers(0, 2),
    leases,
    outcomes,
    st.sampled_from([0.0, 0.0, -1.0]),
    st.one_of(st.just(0.0), corrections),
    st.booleans(),
)
# 429s on the latest turn, which learn (health.py), now and then.
learning_settles = st.builds(
    Settle,
    st.integers(0, 2),
    leases,
    st.builds(
        Outcome,
        st.just("failure"),
        st.just("rate_limited"),
        st.one_of(st.none(), st.sampled_from([0.5, 2.0]), st.floats(0.0, 40.0), lies),
        st.just(True),
    ),
    st.just(0.0),
    st.just(0.0),
    st.just(True),
)
# Reservations and settlements weigh most: they move health and budgets together.
health_ops = st.one_of(
    health_advances,
    health_advances,
    health_advances,
    books,
    books,
    books,
    books,
    books,
    settles,
    settles,
    learning_settles,
    st.builds(
        Sync,
        st.integers(0, 2),
        st.builds(
            Remaining,
            st.one_of(st.none(), st.sampled_from([0.0, 1.0, 3.0]), st.floats(0.0, 60.0)),
            st.one_of(st.none(), st.sampled_from([0.0, 1.0, 7.5]), st.floats(0.0, 60.0), lies),
            st.one_of(st.none(), st.sampled_from([0.0, 10.0]), st.floats(0.0, 100.0)),
        ),
    ),
    st.builds(Correct, st.integers(0, 2), st.sampled_from([0.0, -1.0]), corrections, holds),
    st.just(Query()),
)
# Busy deployments: turns a second or so apart, so waits and learned rates show; per
# minute (what upstream budgets lower), with more windows at times.
paced = st.one_of(
    st.sampled_from([Rate(60, 60, 1), Rate(120, 60, 2), Rate(30, 60, 1), Rate(600, 60, 10)]),
    st.builds(Rate, limit=limits, period=st.just(60.0), capacity=capacities),
)
per_minute_tokens = st.builds(
    Rate, limit=limits, period=st.just(60.0), capacity=capacities, ceiling=ceilings
)
health_windows = st.tuples(
    paced.map(lambda r: _window("requests", r)),
    st.one_of(st.none(), st.none(), per_minute_tokens.map(lambda r: _window("tokens", r))),
    st.one_of(st.none(), st.none(), rates.map(lambda r: _window("requests", r))),
).map(_distinct)
health_deployments = st.lists(
    st.builds(
        DeploymentLimits, id=st.just(""), windows=health_windows, probe_timeout=probe_timeouts
    ),
    min_size=1,
    max_size=3,
)
rules = st.builds(
    CooldownRule,
    allowed_fails=st.integers(1, 3),
    window=st.sampled_from([1.0, 10.0, 60.0]),
    time=st.sampled_from([0.0, 1.0, 5.0, 30.0]),
    max_hold=st.sampled_from([3.0, 300.0]),
)


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    deps=health_deployments,
    rule=rules,
    start=start_times,
    sequence=st.lists(health_ops, min_size=20, max_size=80),
)
def test_lua_matches_the_pure_health_model(
    redis_url: str,
    deps: list[DeploymentLimits],
    rule: CooldownRule,
    start: float,
    sequence: list[Op],
) -> None:
    """Cooldowns, probes, learned rates, in-flight counts, upstream budgets, snapshots:
    identical answers."""
    asyncio.run(run_both(redis_url, KeyLimits("k"), deps, start, sequence, rule))
