"""Budgets: quotas for calendar periods, checked with a key's windows in one step.

The pure math (quota.py), then both backends: every operation applied in lockstep to the
memory backend and to the Redis backend (the Lua scripts) on one injected clock gives
identical answers, exact floats, also across calendar boundaries.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.limits import Clock, at, patient
from support.ports import free_port

from proxy.costs import NOTHING
from proxy.limiter.base import (
    TEAM,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    LimiterUnavailable,
    Period,
    Quota,
    Rate,
    Window,
)
from proxy.limiter.core.periods import PERIODS
from proxy.limiter.core.quota import EMPTY, QuotaState, check, quota_name, settle
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.policy import OnError, ResilientLimiter
from proxy.limiter.redis.backend import RedisLimiter

USD_MONTH = Quota(quota_name("usd", "month"), "usd", 10.0, "month")
TOKENS_DAY = Quota(quota_name("tokens", "day"), "tokens", 1000.0, "day")
NEW_YEAR = at(2027, 1, 1)


# -- the pure math --------------------------------------------------------------------


def test_a_request_that_fits_is_charged_in_the_current_period() -> None:
    states, verdict = check([USD_MONTH], [EMPTY], [4.0], NEW_YEAR - 10)
    assert verdict.allowed
    assert states == [QuotaState(2026 * 12 + 11, 4.0)]


def test_a_request_that_does_not_fit_is_refused_until_the_reset_and_charged_nothing() -> None:
    spent = QuotaState(2026 * 12 + 11, 7.0)
    states, verdict = check([USD_MONTH, TOKENS_DAY], [spent, EMPTY], [3.5, 10.0], NEW_YEAR - 10)
    assert (verdict.refused, verdict.retry_after) == (0, 10.0)
    assert states == [spent, EMPTY]


def test_the_whole_amount_returns_at_the_boundary_and_nothing_before() -> None:
    spent = QuotaState(2026 * 12 + 11, 10.0)
    assert not check([USD_MONTH], [spent], [0.01], NEW_YEAR - 0.001)[1].allowed
    states, verdict = check([USD_MONTH], [spent], [10.0], NEW_YEAR)
    assert verdict.allowed and states == [QuotaState(2027 * 12, 10.0)]


def test_the_budget_that_resets_last_is_the_one_named() -> None:
    quotas = [TOKENS_DAY, USD_MONTH]
    full = [QuotaState(int(at(2026, 12, 15) // 86400), 1000.0), QuotaState(2026 * 12 + 11, 10.0)]
    _, verdict = check(quotas, full, [1.0, 1.0], at(2026, 12, 15, 12))
    assert verdict.refused == 1
    assert verdict.retry_after == NEW_YEAR - at(2026, 12, 15, 12)


def test_a_settlement_corrects_the_period_its_reservation_started_in() -> None:
    started = NEW_YEAR - 5
    (reserved,), _ = check([USD_MONTH], [EMPTY], [4.0], started)
    assert settle(reserved, USD_MONTH, started, -1.5) == QuotaState(reserved.period, 2.5)
    # The month turned before the answer: January's spend is not touched.
    (january,), _ = check([USD_MONTH], [reserved], [1.0], NEW_YEAR + 1)
    assert settle(january, USD_MONTH, started, 3.0) is None


def test_a_charge_for_a_period_the_budget_has_not_reached_starts_it_a_refund_does_not() -> None:
    """A request this store never reserved (admitted by the fallback while Redis was
    down) is charged what it cost; a refund of nothing reserved changes nothing."""
    december = QuotaState(2026 * 12 + 11, 4.0)
    assert settle(december, USD_MONTH, NEW_YEAR + 5, 1.5) == QuotaState(2027 * 12, 1.5)
    assert settle(EMPTY, USD_MONTH, NEW_YEAR + 5, 1.5) == QuotaState(2027 * 12, 1.5)
    assert settle(december, USD_MONTH, NEW_YEAR + 5, -1.5) is None


def test_a_refund_never_makes_the_spend_negative() -> None:
    state = QuotaState(2026 * 12 + 11, 1.0)
    assert settle(state, USD_MONTH, NEW_YEAR - 5, -4.0) == QuotaState(state.period, 0.0)


# -- both backends --------------------------------------------------------------------

RPM = Window("rpm", "requests", Rate(5, 60, 5))
budget_sets = st.lists(
    st.builds(
        lambda kind, period, limit, models: Quota(
            quota_name(kind, period, models), kind, limit, period, models
        ),
        st.sampled_from(["usd", "tokens", "requests"]),
        st.sampled_from(PERIODS),
        st.sampled_from([0.5, 3.0, 100.0]),
        # A budget scoped to models is stored apart from its unscoped twin; which asks
        # it counts is the catalog's business (Catalog.ask_limits), not the limiter's.
        st.sampled_from([(), ("a",)]),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda q: q.name,
).map(tuple)


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Ask:
    usd: float
    tokens: float
    lease: int


@dataclass(frozen=True)
class Settle:
    lease: int
    usd: float
    tokens: float


@dataclass(frozen=True)
class Look:
    pass


Op = Advance | Ask | Settle | Look
money = st.sampled_from([0.0, 0.1, 0.25, 1.0, 2.0]) | st.floats(0.0, 3.0, allow_nan=False)
counts = st.sampled_from([0.0, 1.0, 50.0])
deltas = st.sampled_from([0.0, -0.1, -1.0, 0.5]) | st.floats(-3.0, 3.0, allow_nan=False)
ops = st.one_of(
    st.builds(Advance, st.sampled_from([0.5, 30.0, 3600.0, 86400.0, 7 * 86400.0])),
    st.builds(Ask, money, counts, st.integers(0, 3)),
    st.builds(Ask, money, counts, st.integers(0, 3)),
    st.builds(Settle, st.integers(0, 3), deltas, deltas),
    st.just(Look()),
)
# Just before the boundaries that matter: a day, Sunday night, Dec 31, Feb 28 / 29.
starts = st.sampled_from(
    [at(2026, 11, 25, 23, 59), at(2026, 11, 29, 23, 59), NEW_YEAR - 60, at(2028, 2, 28, 23, 59)]
)


async def run_both(url: str, key: KeyLimits, start: float, sequence: list[Op]) -> None:
    clock = Clock(start)
    memory = MemoryLimiter(clock)
    shared = patient(url, clock=clock, prefix=f"bq{uuid.uuid4().hex}")
    started: dict[int, float] = {}
    try:
        for step, op in enumerate(sequence):
            if isinstance(op, Advance):
                clock.now += op.seconds
            elif isinstance(op, Ask):
                cost = {"usd": op.usd, "tokens": op.tokens, "requests": 1.0}
                ask = KeyAsk(key, f"lease{op.lease}", cost, budget_cost=cost)
                want = memory.acquire_key_now(ask)
                assert await shared.acquire_key(ask) == want, (step, op)
                if want.allowed:
                    started[op.lease] = want.at
            elif isinstance(op, Settle):
                s = KeySettlement(
                    key,
                    f"lease{op.lease}",
                    {"tokens": op.tokens},
                    budget_cost={"usd": op.usd, "tokens": op.tokens},
                    started=started.get(op.lease, clock.now),
                )
                await shared.settle(s)
                memory.settle_now(s)
            else:
                assert await shared.key_snapshot(key) == memory.key_snapshot_now(key), step
    finally:
        await shared.aclose()


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    quotas=budget_sets,
    windows=st.sampled_from([(), (RPM,)]),
    parallel=st.sampled_from([None, 2]),
    team_quotas=st.one_of(st.none(), budget_sets),
    start=starts,
    sequence=st.lists(ops, min_size=1, max_size=30),
)
def test_lua_budgets_match_the_pure_core(
    redis_url: str,
    quotas: tuple[Quota, ...],
    windows: tuple[Window, ...],
    parallel: int | None,
    team_quotas: tuple[Quota, ...] | None,
    start: float,
    sequence: list[Op],
) -> None:
    team = None
    if team_quotas is not None:
        owned = tuple(replace(q, scope=TEAM, owner="t") for q in team_quotas)
        team = KeyLimits("t", (RPM,), 3, scope=TEAM, quotas=owned)
    key = KeyLimits("k", windows, parallel, team=team, quotas=quotas)
    asyncio.run(run_both(redis_url, key, start, sequence))


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_concurrent_asks_never_reserve_past_the_budget(redis_url: str, backend: str) -> None:
    key = KeyLimits("k", quotas=(USD_MONTH,))

    async def main() -> list[bool]:
        limiter = (
            MemoryLimiter(Clock(NEW_YEAR - 3600))
            if backend == "memory"
            else patient(redis_url, prefix=f"bc{uuid.uuid4().hex}")
        )
        asks = [KeyAsk(key, f"l{i}", NOTHING, budget_cost={"usd": 0.75}) for i in range(40)]
        try:
            verdicts = await asyncio.gather(*(limiter.acquire_key(a) for a in asks))
        finally:
            await limiter.aclose()
        return [v.allowed for v in verdicts]

    allowed = asyncio.run(main())
    assert sum(allowed) == 13  # 13 x 0.75 = 9.75 <= 10 < 14 x 0.75


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize(
    ("period", "boundary"),
    [
        ("day", at(2026, 11, 26)),  # end of day
        ("week", at(2026, 11, 30)),  # Sunday -> Monday
        ("month", NEW_YEAR),  # Dec 31 -> Jan 1
        ("month", at(2028, 3, 1)),  # Feb 29 -> Mar 1 (leap year)
        ("month", at(2027, 3, 1)),  # Feb 28 -> Mar 1
    ],
)
def test_a_budget_returns_whole_at_the_boundary_and_a_late_answer_settles_its_own_period(
    redis_url: str, backend: str, period: Period, boundary: float
) -> None:
    budget = Quota(quota_name("usd", period), "usd", 1.0, period)
    key = KeyLimits("k", quotas=(budget,))
    clock = Clock(boundary - 1.0)

    async def main() -> list[Any]:
        limiter: Any = (
            MemoryLimiter(clock)
            if backend == "memory"
            else patient(redis_url, clock=clock, prefix=f"bb{uuid.uuid4().hex}")
        )
        seen: list[Any] = []
        try:
            first = await limiter.acquire_key(KeyAsk(key, "a", NOTHING, budget_cost={"usd": 0.75}))
            seen.append(first.allowed)
            seen.append(
                (
                    await limiter.acquire_key(KeyAsk(key, "b", NOTHING, budget_cost={"usd": 0.5}))
                ).code
            )
            clock.now = boundary  # the period turns while the first is in flight
            third = await limiter.acquire_key(KeyAsk(key, "c", NOTHING, budget_cost={"usd": 0.5}))
            seen.append(third.allowed)
            # The first's answer: it cost 0.25 more than reserved, in its own period.
            late = KeySettlement(key, "a", NOTHING, budget_cost={"usd": 0.25}, started=first.at)
            await limiter.settle(late)
            [(_, left)] = (await limiter.key_snapshot(key)).budgets
            seen.append(left.remaining)
        finally:
            await limiter.aclose()
        return seen

    allowed, refusal, after, remaining = asyncio.run(main())
    assert allowed and after
    assert refusal == f"key_budget_usd_{period}"
    assert remaining == 0.5  # the new period holds only the third's reservation


@pytest.mark.parametrize("on_error", ["local", "reject"])
def test_with_redis_down_a_budget_follows_on_error(on_error: OnError) -> None:
    """``local``: each replica may spend its share of the budget (here one of two
    replicas: half); ``reject``: no verdict (the HTTP layer answers 503)."""
    key = KeyLimits("k", quotas=(USD_MONTH,))

    async def main() -> list[object]:
        nothing_there = RedisLimiter(f"redis://127.0.0.1:{free_port()}", op_timeout=0.2)
        limiter = ResilientLimiter(
            nothing_there,
            on_error=on_error,
            replica_id="a",
            initial_replicas=2,
        )
        seen: list[object] = []
        try:
            for _ in range(3):
                try:
                    verdict = await limiter.acquire_key(
                        KeyAsk(key, "l", NOTHING, budget_cost={"usd": 2.0})
                    )
                    seen.append(verdict.allowed)
                except LimiterUnavailable:
                    seen.append("unavailable")
        finally:
            await limiter.aclose()
        return seen

    seen = asyncio.run(main())
    if on_error == "local":
        assert seen == [True, True, False]  # 2 + 2 <= 5, the half of 10
    else:
        assert seen == ["unavailable"] * 3


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_team_s_budget_is_shared_by_its_keys_and_names_the_team(
    redis_url: str, backend: str
) -> None:
    team_budget = replace(USD_MONTH, scope=TEAM, owner="research")
    team = KeyLimits("research", scope=TEAM, quotas=(team_budget,))
    alice = KeyLimits("alice", team=team)
    bob = KeyLimits("bob", team=team, quotas=(replace(USD_MONTH, owner="bob", limit=100.0),))

    async def main() -> list[str | None]:
        limiter: Any = (
            MemoryLimiter(Clock(NEW_YEAR - 3600))
            if backend == "memory"
            else patient(redis_url, prefix=f"bt{uuid.uuid4().hex}")
        )
        codes: list[str | None] = []
        try:
            for i, key in enumerate([alice, bob, alice, bob, bob]):
                ask = KeyAsk(key, f"r{i}", NOTHING, budget_cost={"usd": 3.0})
                codes.append((await limiter.acquire_key(ask)).code)
            [(_, left)] = (await limiter.key_snapshot(team)).budgets
            codes.append(str(left.remaining))
        finally:
            await limiter.aclose()
        return codes

    codes = asyncio.run(main())
    # 3 + 3 + 3 of the team's 10; the fourth does not fit, whoever sends it.
    assert codes == [None, None, None, "team_budget_usd_month", "team_budget_usd_month", "1.0"]
