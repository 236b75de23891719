"""A budget's edge (``budget_edge: clamp``): the output cap lowered to what a budget has
left can pay, in the same step as every check (core/edge.py).

The pure arithmetic on injected values first, then both backends: the memory limiter
and the Lua script give identical verdicts and states (exact floats), and concurrent
asks on either reserve no more than the budget, using it to the last output token.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.limits import Clock, at, patient
from support.ports import free_port

from proxy.limiter.base import TEAM, Clamp, KeyAsk, KeyLimits, KeySettlement, Quota
from proxy.limiter.core import edge
from proxy.limiter.core.quota import EMPTY, QuotaState, check, quota_name
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.policy import ResilientLimiter
from proxy.limiter.redis.backend import RedisLimiter

NOW = at(2026, 12, 15, 12)
DAY = int(NOW // 86400)
MONTH = 2026 * 12 + 11
TOKENS = Quota(quota_name("tokens", "day"), "tokens", 10_000.0, "day", clamp=True)
USD = Quota(quota_name("usd", "month"), "usd", 1.0, "month", clamp=True)
# A request: 100 input tokens at most (0.0001 USD at 1 USD per 1M), then each token of
# its cap: 1 token, 0.00001 USD (10 USD per 1M output tokens); 2,000 asked for.
BASE = {"requests": 1.0, "tokens": 100.0, "input_tokens": 100.0, "output_tokens": 0.0, "usd": 1e-4}
PER = {"tokens": 1.0, "output_tokens": 1.0, "usd": 1e-5}
ASKED = Clamp(BASE, PER, most=2000)


def spent(tokens: float = 0.0, usd: float = 0.0) -> list[QuotaState]:
    return [QuotaState(DAY, tokens), QuotaState(MONTH, usd)]


# -- the arithmetic -------------------------------------------------------------------


def test_a_request_the_budget_pays_whole_keeps_its_cap() -> None:
    costs, cap = edge.charge([TOKENS], [EMPTY], ASKED, NOW)
    assert cap == 0  # not lowered
    assert costs == [2100.0]


def test_the_cap_is_lowered_to_what_is_left_after_the_input() -> None:
    # 9,000 spent: 1,000 left, 100 of them the input's: 900 output tokens.
    costs, cap = edge.charge([TOKENS], [QuotaState(DAY, 9000.0)], ASKED, NOW)
    assert cap == 900
    assert costs == [1000.0]  # the budget to its last token
    states, verdict = check([TOKENS], [QuotaState(DAY, 9000.0)], costs, NOW)
    assert verdict.allowed and states == [QuotaState(DAY, 10_000.0)]


def test_a_dollar_budget_pays_the_output_at_its_price() -> None:
    # 0.99 spent: 0.01 left, 0.0001 of it the input's: 990 output tokens at 0.00001.
    quotas = [USD]
    costs, cap = edge.charge(quotas, [QuotaState(MONTH, 0.99)], ASKED, NOW)
    assert cap in (989, 990)  # the division's last bit decides; never more
    assert 0.99 + costs[0] <= 1.0
    assert 0.99 + (BASE["usd"] + PER["usd"] * (cap + 1)) > 1.0


def test_each_completion_pays_its_cap() -> None:
    three = Clamp(BASE, {"tokens": 3.0, "output_tokens": 3.0}, most=2000)
    costs, cap = edge.charge([TOKENS], [QuotaState(DAY, 9000.0)], three, NOW)
    assert cap == 300 and costs == [1000.0]


def test_the_tightest_budget_sets_the_cap_and_every_budget_is_charged_at_it() -> None:
    costs, cap = edge.charge([TOKENS, USD], spent(tokens=5000.0, usd=0.995), ASKED, NOW)
    assert cap == 490  # the dollars: 0.005 - 0.0001 left pays 490 tokens
    assert costs == [590.0, pytest.approx(1e-4 + 490e-5)]


def test_a_budget_that_cannot_pay_the_least_output_keeps_the_cap_and_refuses() -> None:
    full = [QuotaState(DAY, 9900.0)]  # 100 left: the input's, no output token
    costs, cap = edge.charge([TOKENS], full, ASKED, NOW)
    assert (costs, cap) == ([2100.0], 0)
    assert check([TOKENS], full, costs, NOW)[1].refused == 0
    # A Responses request may not go below 16: 15 left for output is a refusal too.
    responses = replace(ASKED, least=16)
    assert edge.charge([TOKENS], [QuotaState(DAY, 9885.0)], responses, NOW)[1] == 0
    assert edge.charge([TOKENS], [QuotaState(DAY, 9884.0)], responses, NOW)[1] == 16


def test_a_budget_that_refuses_is_charged_at_the_cap_a_clamping_one_left() -> None:
    refusing = replace(TOKENS, clamp=False)
    # The clamping dollars lower the cap to 490; the refusing tokens budget (1,000
    # left) pays that, though it could not have paid the request whole.
    state = spent(tokens=9000.0, usd=0.995)
    costs, cap = edge.charge([refusing, USD], state, ASKED, NOW)
    assert cap == 490
    assert check([refusing, USD], state, costs, NOW)[1].allowed
    # Alone, a refusing budget lowers nothing: the request is refused as it always was.
    costs, cap = edge.charge([refusing], [QuotaState(DAY, 9000.0)], ASKED, NOW)
    assert cap == 0
    assert not check([refusing], [QuotaState(DAY, 9000.0)], costs, NOW)[1].allowed


def test_a_budget_no_output_token_costs_is_never_a_reason_to_lower() -> None:
    requests = Quota(quota_name("requests", "day"), "requests", 5.0, "day", clamp=True)
    costs, cap = edge.charge([requests], [QuotaState(DAY, 4.0)], ASKED, NOW)
    assert (costs, cap) == ([1.0], 0)


def test_a_spend_of_an_earlier_period_counts_as_nothing() -> None:
    yesterday = [QuotaState(DAY - 1, 9999.0)]
    assert edge.charge([TOKENS], yesterday, ASKED, NOW) == ([2100.0], 0)


def test_reserved_is_what_the_verdict_charged() -> None:
    whole = edge.at(ASKED, ASKED.most)
    assert edge.reserved(whole, ASKED, 0) is whole
    assert edge.reserved(whole, ASKED, 900)["tokens"] == 1000.0
    assert edge.reserved(whole, None, 900) is whole


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    limit=st.floats(1.0, 1e6),
    used=st.floats(0.0, 1.0),
    base=st.floats(0.0, 500.0),
    per=st.sampled_from([1.0, 2.0, 3.0, 1e-5, 2.5e-6, 0.7]),
    most=st.integers(1, 100_000),
    least=st.integers(1, 20),
)
def test_the_cap_is_the_largest_the_budget_pays_and_never_passes_it(
    limit: float, used: float, base: float, per: float, most: int, least: int
) -> None:
    quota = Quota("b", "tokens", limit, "day", clamp=True)
    state = [QuotaState(DAY, limit * used)]
    clamp = Clamp({"tokens": base}, {"tokens": per}, most=most, least=least)
    costs, lowered = edge.charge([quota], state, clamp, NOW)
    _, verdict = check([quota], state, costs, NOW)
    fits = state[0].spent + costs[0] <= limit
    assert verdict.allowed == fits
    if lowered:
        assert least <= lowered < most and fits
        assert costs[0] == base + per * lowered
        # one token more would not fit: the budget is used to its last output token
        assert state[0].spent + (base + per * (lowered + 1)) > limit
    elif not fits:  # refused: not even ``least`` tokens fit
        assert state[0].spent + (base + per * least) > limit * (1 + 1e-12)
    left = limit - state[0].spent - base
    if left >= per * most:
        assert not lowered
    if lowered:
        assert lowered >= min(most, math.floor(left / per)) - 1


# -- both backends --------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    lease: int
    most: int
    input: float


@dataclass(frozen=True)
class Settle:
    lease: int
    units: float


@dataclass(frozen=True)
class Advance:
    seconds: float


Op = Ask | Settle | Advance
ops = st.one_of(
    st.builds(
        Ask,
        st.integers(0, 3),
        st.sampled_from([16, 100, 700, 5000]),
        st.sampled_from([0.0, 10.0, 90.0]),
    ),
    st.builds(Ask, st.integers(0, 3), st.integers(1, 3000), st.floats(0.0, 200.0)),
    st.builds(Settle, st.integers(0, 3), st.sampled_from([-50.0, -400.0, 0.0, 20.0])),
    st.builds(Advance, st.sampled_from([1.0, 3600.0, 86400.0])),
)
budgets = st.lists(
    st.builds(
        lambda kind, limit, clamp: Quota(quota_name(kind, "day"), kind, limit, "day", clamp=clamp),
        st.sampled_from(["tokens", "usd", "output_tokens", "requests"]),
        st.sampled_from([1000.0, 2500.0, 0.05, 3.0]),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda q: q.name,
).map(tuple)


def clamp_of(op: Ask) -> Clamp:
    base = {"requests": 1.0, "tokens": op.input, "input_tokens": op.input, "usd": op.input * 3e-6}
    return Clamp(base, {"tokens": 1.0, "output_tokens": 1.0, "usd": 1.5e-5}, op.most, least=1)


async def lockstep(url: str, key: KeyLimits, sequence: list[Op]) -> None:
    clock = Clock(at(2026, 11, 25, 20))
    memory = MemoryLimiter(clock)
    shared = patient(url, clock=clock, prefix=f"be{uuid.uuid4().hex}")
    started: dict[int, float] = {}
    try:
        for step, op in enumerate(sequence):
            if isinstance(op, Advance):
                clock.now += op.seconds
            elif isinstance(op, Ask):
                clamp = clamp_of(op)
                ask = KeyAsk(key, f"l{op.lease}", {"requests": 1.0}, edge.at(clamp, op.most), clamp)
                want = memory.acquire_key_now(ask)
                assert await shared.acquire_key(ask) == want, (step, op)
                if want.allowed:
                    started[op.lease] = want.at
            else:
                s = KeySettlement(
                    key,
                    f"l{op.lease}",
                    budget_cost={"tokens": op.units, "output_tokens": op.units},
                    started=started.get(op.lease, clock.now),
                )
                await shared.settle(s)
                memory.settle_now(s)
            assert await shared.key_snapshot(key) == memory.key_snapshot_now(key), step
    finally:
        await shared.aclose()


@pytest.mark.slow
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    quotas=budgets, team_quotas=st.one_of(st.none(), budgets), sequence=st.lists(ops, max_size=25)
)
def test_lua_clamps_as_the_pure_core(
    redis_url: str,
    quotas: tuple[Quota, ...],
    team_quotas: tuple[Quota, ...] | None,
    sequence: list[Op],
) -> None:
    team = None
    if team_quotas is not None:
        owned = tuple(replace(q, scope=TEAM, owner="t") for q in team_quotas)
        team = KeyLimits("t", scope=TEAM, quotas=owned)
    key = KeyLimits("k", team=team, quotas=quotas)
    asyncio.run(lockstep(redis_url, key, sequence))


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_concurrent_asks_use_the_budget_to_the_last_token_and_never_pass_it(
    redis_url: str, backend: str
) -> None:
    """40 asks at once of 100 input and 700 output tokens against 10,000: twelve whole
    (9,600), one lowered to the 300 left after its input, the rest refused."""
    key = KeyLimits("k", quotas=(TOKENS,))
    clamp = Clamp({"tokens": 100.0}, {"tokens": 1.0}, most=700)

    async def main() -> list[Any]:
        limiter: Any = (
            MemoryLimiter(Clock(NOW))
            if backend == "memory"
            else patient(redis_url, prefix=f"bc{uuid.uuid4().hex}")
        )
        asks = [KeyAsk(key, f"l{i}", {}, edge.at(clamp, 700), clamp) for i in range(40)]
        try:
            verdicts = await asyncio.gather(*(limiter.acquire_key(a) for a in asks))
            [(_, left)] = (await limiter.key_snapshot(key)).budgets
        finally:
            await limiter.aclose()
        return [*verdicts, left.remaining]

    *verdicts, remaining = asyncio.run(main())
    allowed = [v for v in verdicts if v.allowed]
    assert sorted(v.cap for v in allowed) == [0] * 12 + [300]
    assert remaining == 0.0
    refused = [v for v in verdicts if not v.allowed]
    assert {v.code for v in refused} == {"key_budget_tokens_day"}


def test_with_redis_down_the_local_share_clamps_and_owes_what_it_charged() -> None:
    """The fallback's share (half of 10,000 on one of two replicas) clamps as the
    shared budget does, and what it owes the storage is the lowered reservation."""
    key = KeyLimits("k", quotas=(TOKENS,))
    clamp = Clamp({"tokens": 100.0}, {"tokens": 1.0}, most=2000)

    async def main() -> tuple[list[int], Any]:
        nothing_there = RedisLimiter(f"redis://127.0.0.1:{free_port()}", op_timeout=0.2)
        limiter = ResilientLimiter(
            nothing_there, on_error="local", replica_id="a", initial_replicas=2
        )
        caps = []
        try:
            warm = KeyLimits("w", quotas=(replace(TOKENS, owner="w"),))
            for i in range(3):  # the storage's failures open its circuit
                await limiter.acquire_key(KeyAsk(warm, f"w{i}", {}, {"tokens": 1.0}))
            for i in range(4):
                ask = KeyAsk(key, f"l{i}", {}, edge.at(clamp, 2000), clamp)
                verdict = await limiter.acquire_key(ask)
                caps.append(verdict.cap if verdict.allowed else -1)
            owed = dict(limiter._unshared)
        finally:
            await limiter.aclose()
        return caps, owed

    caps, owed = asyncio.run(main())
    assert caps == [0, 0, 700, -1]  # 2,100 + 2,100 + (100 + 700) = 5,000
    assert {slot: cost["tokens"] for slot, cost in owed.items() if slot.startswith("l")} == {
        "l0": 2100.0,
        "l1": 2100.0,
        "l2": 800.0,
    }
