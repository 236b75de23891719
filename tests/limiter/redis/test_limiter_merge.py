"""Key settlements of one key merged into one ``settle_key`` call (backend.py
``merge_key_settlements``): per window, the sum of the refunds, then the sum of the
charges. ``bucket.adjust`` clips a debt at zero, so that order matters: it is the most
conservative one, and the merged call leaves the debt that applying the settlements one
by one in that order leaves (exactly for whole numbers of tokens, as real minus
estimated token counts are; up to the rounding of the sums otherwise)."""

from __future__ import annotations

import asyncio
import math
import uuid
from itertools import permutations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.limits import Clock, patient, rpm, window

from proxy.costs import estimate_cost
from proxy.limiter.base import KeyAsk, KeyLimits, KeySettlement, Rate
from proxy.limiter.core import bucket
from proxy.limiter.core.bucket import BucketState
from proxy.limiter.redis.backend import merge_key_settlements
from proxy.limiter.redis.batch import ScriptCall

rates = st.builds(
    Rate,
    limit=st.sampled_from([1.0, 7.0, 100.0, 6000.0]),
    period=st.sampled_from([1.0, 60.0, 3600.0]),
    capacity=st.sampled_from([1.0, 50.0, 6000.0]),
)
whole = st.integers(min_value=-500, max_value=500).filter(bool).map(float)
fractional = st.floats(min_value=-80.0, max_value=80.0, allow_nan=False).filter(bool)


def one_by_one(state: BucketState, rate: Rate, units: list[float], now: float) -> BucketState:
    for u in units:
        state = bucket.adjust(state, rate, u, now)
    return state


def merged(state: BucketState, rate: Rate, units: list[float], now: float) -> BucketState:
    """What the merged ``settle_key`` does to one window: the refunds' sum, then the
    charges' sum (a sum of zero is not sent)."""
    refunds = sum(u for u in units if u < 0.0)
    charges = sum(u for u in units if u > 0.0)
    for total in (refunds, charges):
        if total != 0.0:
            state = bucket.adjust(state, rate, total, now)
    return state


def refunds_first(units: list[float]) -> list[float]:
    return sorted(units, key=lambda u: u > 0.0)  # stable: each kind in its own order


@pytest.mark.slow
@given(
    rate=rates,
    debt=st.integers(min_value=0, max_value=10_000).map(float),
    units=st.lists(whole, min_size=1, max_size=8),
)
def test_merged_whole_corrections_equal_refunds_then_charges_one_by_one_exactly(
    rate: Rate, debt: float, units: list[float]
) -> None:
    now = 1_700_000_000.25
    state = BucketState(debt, now)
    assert merged(state, rate, units, now) == one_by_one(state, rate, refunds_first(units), now)


@pytest.mark.slow
@given(
    rate=rates,
    debt=st.floats(min_value=0.0, max_value=10_000.0),
    elapsed=st.floats(min_value=0.0, max_value=120.0),
    units=st.lists(st.one_of(whole, fractional), min_size=1, max_size=8),
)
def test_merged_corrections_equal_refunds_then_charges_one_by_one(
    rate: Rate, debt: float, elapsed: float, units: list[float]
) -> None:
    now = 12345.678
    state = BucketState(debt, now - elapsed)
    got = merged(state, rate, units, now)
    want = one_by_one(state, rate, refunds_first(units), now)
    assert got.at == want.at == now
    scale = 1.0 + debt + sum(abs(u) for u in units)
    assert math.isclose(got.debt, want.debt, rel_tol=0.0, abs_tol=1e-12 * scale)


@pytest.mark.slow
@given(
    rate=rates,
    debt=st.floats(min_value=0.0, max_value=200.0),
    units=st.lists(st.one_of(whole, fractional), min_size=1, max_size=5),
)
def test_refunds_first_is_the_most_conservative_order(
    rate: Rate, debt: float, units: list[float]
) -> None:
    # A refund clipped at zero is lost; a charge never is: no order leaves more debt.
    now = 100.0
    state = BucketState(debt, now)
    got = merged(state, rate, units, now).debt
    scale = 1.0 + debt + sum(abs(u) for u in units)
    for order in permutations(units):
        assert one_by_one(state, rate, list(order), now).debt <= got + 1e-12 * scale


# -- the merge of a batch ----------------------------------------------------------------


def settle(name: str, *units: float, lease: str = "", now: str = "", team: str = "") -> ScriptCall:
    """A key's settlement: its slots, its team's (its own again without one), its tpm
    window and, in a team, the team's."""
    own = f"{{p:t:{team}}}:k:{name}:" if team else f"{{p:k:{name}}}:"
    keys = [own + "leases", f"{{p:t:{team}}}:leases" if team else own + "leases"]
    args = [now, lease]
    for u in units:
        keys += [own + "tpm"] + ([f"{{p:t:{team}}}:tpm"] if team else [])
        args += ["0.01", repr(u)] * (2 if team else 1)
    return "settle_key", keys, args


def acquire(name: str) -> ScriptCall:
    leases = f"{{p:k:{name}}}:leases"
    return "acquire_key", [leases, leases, f"{{p:k:{name}}}:tpm"], ["", "", "l", "1", ""]


def test_settlements_of_one_key_become_one_call_in_place_of_the_first() -> None:
    calls = [settle("a", -5.0), settle("b", 3.0), settle("a", 7.0), settle("a", -2.0)]
    merged_calls, owners = merge_key_settlements(calls) or ([], [])
    assert merged_calls == [
        (
            "settle_key",
            ["{p:k:a}:leases", "{p:k:a}:leases", "{p:k:a}:tpm", "{p:k:a}:tpm"],
            ["", "", "0.01", "-7.0", "0.01", "7.0"],
        ),
        settle("b", 3.0),
    ]
    assert owners == [0, 1, 0, 0]


def test_a_call_touching_the_key_between_settlements_keeps_them_apart() -> None:
    calls = [settle("a", -5.0), acquire("a"), settle("a", 7.0), settle("a", 1.0)]
    merged_calls, owners = merge_key_settlements(calls) or ([], [])
    assert merged_calls == [calls[0], calls[1], settle("a", 8.0)]
    assert owners == [0, 1, 2, 2]
    # Another key's check does not.
    calls = [settle("a", -5.0), acquire("b"), settle("a", -1.0)]
    assert merge_key_settlements(calls) == ([settle("a", -6.0), acquire("b")], [0, 1, 0])


def test_a_team_window_another_key_corrected_meanwhile_keeps_settlements_apart() -> None:
    # b's correction of the team's window comes between a's two: a's second is not
    # moved before it (corrections do not commute).
    calls = [settle("a", -5.0, team="t"), settle("b", 3.0, team="t"), settle("a", 7.0, team="t")]
    assert merge_key_settlements(calls) is None
    calls = [settle("a", -5.0, team="t"), settle("a", 7.0, team="t")]
    merged_calls, owners = merge_key_settlements(calls) or ([], [])
    [(_, keys, args)] = merged_calls
    assert keys[:2] == ["{p:t:t}:k:a:leases", "{p:t:t}:leases"]
    assert sorted(zip(keys[2:], args[3::2], strict=True)) == [
        ("{p:t:t}:k:a:tpm", "-5.0"),
        ("{p:t:t}:k:a:tpm", "7.0"),
        ("{p:t:t}:tpm", "-5.0"),
        ("{p:t:t}:tpm", "7.0"),
    ]
    assert owners == [0, 0]


def test_slot_releases_and_other_clocks_go_alone() -> None:
    released = settle("a", -5.0, lease="l1")
    assert merge_key_settlements([released, settle("a", 1.0, lease="l2")]) is None
    # A release between two settlements touches the key: it keeps them apart.
    assert merge_key_settlements([settle("a", 1.0), released, settle("a", 2.0)]) is None
    assert merge_key_settlements([settle("a", 1.0, now="5.0"), settle("a", 2.0, now="6.0")]) is None
    assert merge_key_settlements([settle("a", 1.0), acquire("a")]) is None


# -- on a real Redis ---------------------------------------------------------------------


async def settle_merged_and_one_by_one(
    url: str, limits: KeyLimits, spent: float, elapsed: float, tokens: list[float]
) -> tuple[list[dict[str, str]], list[dict[str, str]], int]:
    """The same key settled concurrently (merged) and one by one, refunds first, each
    under its own prefix on one clock; the windows' raw states and how many settlements
    completed."""
    clock = Clock(1_700_000_000.5)
    prefixes = [f"m{uuid.uuid4().hex}", f"s{uuid.uuid4().hex}"]
    together = patient(url, clock=clock, prefix=prefixes[0], linger=3600)
    alone = patient(url, clock=clock, prefix=prefixes[1])
    try:
        for lim in (together, alone):
            assert (await lim.acquire_key(KeyAsk(limits, "x", estimate_cost(spent)))).allowed
        clock.now += elapsed
        settling = [
            asyncio.ensure_future(together.settle(KeySettlement(limits, "", {"tokens": t})))
            for t in tokens
        ]
        for _ in range(3):
            await asyncio.sleep(0)  # every settlement waits in the batch
        await together.key_snapshot(limits)  # urgent: takes them along
        done = sum(1 for _ in await asyncio.gather(*settling))
        for t in refunds_first(tokens):
            await alone.settle(KeySettlement(limits, "", {"tokens": t}))
    finally:
        await together.aclose()
        await alone.aclose()
    with redis.Redis.from_url(url, decode_responses=True) as client:
        states = [
            [client.hgetall(f"{{{p}:k:{limits.name}}}:{w.name}") for w in limits.windows]
            for p in prefixes
        ]
    return states[0], states[1], done


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tpm=st.sampled_from([100.0, 6000.0, 1e6]),
    spent=st.integers(min_value=0, max_value=100).map(float),
    elapsed=st.sampled_from([0.0, 0.0, 0.3, 7.0, 61.0]),
    tokens=st.lists(st.one_of(whole, fractional), min_size=2, max_size=8),
)
def test_merged_settlements_on_redis_equal_refunds_then_charges_one_by_one(
    redis_url: str, tpm: float, spent: float, elapsed: float, tokens: list[float]
) -> None:
    limits = KeyLimits(
        "k", windows=(rpm(600), window("tokens", tpm), window("tokens", tpm * 100, 86400.0))
    )
    got, want, done = asyncio.run(
        settle_merged_and_one_by_one(redis_url, limits, spent, elapsed, tokens)
    )
    assert done == len(tokens)
    exact = elapsed == 0.0 and all(t.is_integer() for t in tokens)
    for g, w in zip(got, want, strict=True):
        assert g["t"] == w["t"]
        if exact:
            assert g["d"] == w["d"]
        else:
            scale = 1.0 + spent + sum(abs(t) for t in tokens)
            assert math.isclose(float(g["d"]), float(w["d"]), rel_tol=0.0, abs_tol=1e-12 * scale)
