"""The pure core beyond the shared table: multi-bucket takes, the choice among
candidates, usage for headers, and properties that must hold for any sequence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.limiter.base import Rate, Usage
from proxy.limiter.core.bucket import (
    FULL,
    Admission,
    Bucket,
    BucketState,
    Decision,
    adjust,
    lower,
    take,
    take_all,
    usage,
)
from proxy.limiter.core.bucket import (
    held as held_bucket,
)
from proxy.limiter.core.selection import Candidate, select

RPM = Rate(60, 60, 1)  # one request a second, no burst
TPM = Rate(600, 60, 100)  # ten tokens a second, 100 at once


def test_rate_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Rate(0, 60, 1)
    with pytest.raises(ValueError):
        Rate(10, 60, 0)


def test_state_is_gcra_tat() -> None:
    state, _ = take(FULL, RPM, 1, now=100.0, max_wait=0)
    assert state.tat(RPM) == 101.0
    state, decision = take(state, RPM, 1, now=100.0, max_wait=5)
    assert decision == Decision(Admission.ALLOWED, wait=1.0, binding=0)
    assert state.tat(RPM) == 102.0


def test_multi_bucket_waits_for_the_slowest_and_charges_both() -> None:
    rpm = BucketState(0.0, 0.0)
    tpm = BucketState(100.0, 0.0)  # empty: 50 tokens take 5 s
    states, decision = take_all([Bucket(rpm, RPM, 1), Bucket(tpm, TPM, 50)], 0.0, max_wait=10)
    assert decision == Decision(Admission.ALLOWED, wait=5.0, binding=1)
    # rpm is charged as of the turn (t=5), not now: its next turn is t=6, not t=1.
    assert states[0].tat(RPM) == 6.0
    assert states[1].tat(TPM) == 15.0


def test_multi_bucket_is_all_or_nothing() -> None:
    rpm = BucketState(0.0, 0.0)
    tpm = BucketState(100.0, 0.0)
    buckets = [Bucket(rpm, RPM, 1), Bucket(tpm, TPM, 50)]
    states, decision = take_all(buckets, 0.0, max_wait=1)
    assert decision == Decision(Admission.REFUSED, retry_after=4.0, binding=1)
    assert states == [rpm, tpm]


def test_multi_bucket_too_large_in_any_bucket() -> None:
    states, decision = take_all([Bucket(FULL, RPM, 1), Bucket(FULL, TPM, 101)], 0.0, 100)
    assert decision.admission is Admission.TOO_LARGE and decision.binding == 1
    assert states == [FULL, FULL]


def test_no_buckets_means_unlimited() -> None:
    assert take_all([], 0.0, 0.0) == ([], Decision(Admission.ALLOWED))


def test_adjust_refunds_down_to_full_and_charges_past_capacity() -> None:
    state, _ = take(FULL, TPM, 30, 0.0, 0)
    assert adjust(state, TPM, -100, 1.0) == BucketState(0.0, 1.0)
    assert adjust(state, TPM, 500, 1.0).debt == 520.0  # 30 - 10 drained + 500


def test_a_refund_stops_at_the_floor_as_it_drains_and_never_raises_to_it() -> None:
    """The floor (allowance.lease_floor) is what the bucket's leases still count on."""
    state, floor = BucketState(30.0, 0.0), BucketState(25.0, 0.0)
    assert adjust(state, TPM, -100, 1.0, floor) == BucketState(15.0, 1.0)  # 25 - 10
    assert adjust(state, TPM, -3, 1.0, floor).debt == 17.0  # above it: whole
    assert adjust(BucketState(5.0, 1.0), TPM, -3, 1.0, floor).debt == 5.0  # never raised
    assert adjust(state, TPM, -100, 3.0, floor).debt == 0.0  # drained: whole


def test_usage_for_headers() -> None:
    key = Rate(50, 60, 50)
    state = FULL
    for _ in range(10):
        state, _ = take(state, key, 1, 0.0, 0)
    now = usage(state, key, 0.0)
    assert (now.limit, now.remaining) == (50, 40.0)
    assert now.reset == pytest.approx(12.0)
    assert usage(state, key, 6.0).remaining == pytest.approx(45.0)
    assert usage(FULL, key, 0.0) == Usage(limit=50, remaining=50.0, reset=0.0)
    # Turns reserved ahead: nothing remains (never negative), reset covers the queue.
    queued = BucketState(debt=60.0, at=0.0)
    assert usage(queued, key, 0.0) == Usage(limit=50, remaining=0.0, reset=72.0)


def cands(*debts: float) -> list[Candidate]:
    return [Candidate([Bucket(BucketState(d, 0.0), RPM, 1)]) for d in debts]


def test_select_prefers_list_order_among_those_that_can_go_now() -> None:
    # Both can go now (capacity 2); the first wins though the second has more to spare.
    burst = Rate(60, 60, 2)
    first = Candidate([Bucket(BucketState(1.0, 0.0), burst, 1)])
    second = Candidate([Bucket(FULL, burst, 1)])
    choice = select([first, second], 0.0, 0.0)
    assert choice.index == 0 and choice.waits == [0.0, 0.0]


def test_select_go_now_beats_any_wait() -> None:
    choice = select(cands(2.0, 0.0, 1.5), 0.0, 30.0)
    assert choice.index == 1 and choice.decision.wait == 0.0
    assert choice.waits == [2.0, 0.0, 1.5]


def test_select_picks_the_shortest_wait() -> None:
    choice = select(cands(3.0, 1.5, 2.0), 0.0, 30.0)
    assert choice.index == 1 and choice.decision.wait == 1.5
    assert choice.states == [BucketState(2.5, 0.0)]


def test_select_refuses_when_none_fits_and_charges_nothing() -> None:
    choice = select(cands(9.0, 5.0), 0.0, 2.0)
    assert choice.index == -1 and choice.states == []
    assert choice.decision == Decision(Admission.REFUSED, retry_after=3.0, binding=0)


def test_select_skips_candidates_too_small() -> None:
    small = Candidate([Bucket(FULL, Rate(10, 60, 5), 8)])
    big = Candidate([Bucket(BucketState(1.0, 0.0), TPM, 8)])
    choice = select([small, big], 0.0, 0.0)
    assert choice.index == 1 and choice.waits == [math.inf, 0.0]
    none_fits = select([small, small], 0.0, 0.0)
    assert none_fits.decision.admission is Admission.TOO_LARGE and none_fits.index == -1


def test_select_needs_candidates() -> None:
    with pytest.raises(ValueError):
        select([], 0.0, 0.0)


# -- properties ------------------------------------------------------------------------

rates = st.builds(
    Rate,
    limit=st.floats(0.5, 200, allow_nan=False),
    period=st.sampled_from([1.0, 60.0, 7.0]),
    capacity=st.floats(0.5, 50, allow_nan=False),
)
requests = st.lists(
    st.tuples(
        st.floats(0, 5, allow_nan=False),  # seconds since the previous request
        st.floats(0, 20, allow_nan=False),  # cost in bucket a
        st.floats(0, 20, allow_nan=False),  # cost in bucket b
        st.sampled_from([0.0, 0.5, 5.0, 60.0]),  # max_wait
    ),
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(a=rates, b=rates, reqs=requests)
def test_turns_never_exceed_the_rate(a: Rate, b: Rate, reqs: list[tuple[float, ...]]) -> None:
    """GCRA's guarantee, per bucket, for the turns handed out (now + wait): over any
    window [s, e] the units sent are at most capacity + (e - s) / interval."""
    states = [FULL, FULL]
    now = 0.0
    sent: list[list[tuple[float, float]]] = [[], []]
    for dt, cost_a, cost_b, max_wait in reqs:
        now += dt
        buckets = [Bucket(states[0], a, cost_a), Bucket(states[1], b, cost_b)]
        new, decision = take_all(buckets, now, max_wait)
        if decision.allowed:
            assert 0.0 <= decision.wait <= max_wait
            turn = now + decision.wait
            sent[0].append((turn, cost_a))
            sent[1].append((turn, cost_b))
        else:
            assert new == [bk.state for bk in buckets]  # nothing charged
        states = new
    for rate, turns in zip((a, b), sent, strict=True):
        turns.sort()
        for i, (start, _) in enumerate(turns):
            total = 0.0
            for end, cost in turns[i:]:
                total += cost
                allowed = rate.capacity + (end - start) / rate.interval
                assert total <= allowed * (1 + 1e-9) + 1e-9


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    rate=rates,
    reqs=requests,
    cost=st.floats(0, 20, allow_nan=False),
    max_wait=st.sampled_from([0.0, 1.0, 10.0]),
)
def test_retrying_after_retry_after_succeeds(
    rate: Rate, reqs: list[tuple[float, ...]], cost: float, max_wait: float
) -> None:
    state, now = FULL, 0.0
    for dt, c, _, mw in reqs:
        now += dt
        state, _ = take(state, rate, c, now, mw)
    _, decision = take(state, rate, cost, now, max_wait)
    if decision.admission is Admission.REFUSED:
        later = now + decision.retry_after + 1e-9
        _, retried = take(state, rate, cost, later, max_wait)
        assert retried.allowed
        assert retried.wait == pytest.approx(max_wait, abs=1e-6)
    elif decision.admission is Admission.TOO_LARGE:
        assert cost > rate.capacity


def test_a_debt_in_units_survives_a_change_of_rate() -> None:
    half = Rate(30, 60, 1)  # one request every 2 s
    state, decision = take(FULL, half, 1, 0.0, max_wait=10)
    assert decision.wait == 0.0
    assert take(state, half, 1, 0.0, max_wait=10)[1].wait == 2.0
    # The same state read at the full rate refills twice as fast.
    assert take(state, RPM, 1, 0.0, max_wait=10)[1].wait == 1.0
    assert adjust(state, half, 0.0, 1.0).debt == 0.5


def test_held_takes_nothing_until_the_hold_then_paces_again() -> None:
    busy, _ = take(FULL, RPM, 1, 0.0, max_wait=0)
    for _ in range(5):  # turns reserved up to 5 s ahead
        busy, _ = take(busy, RPM, 1, 0.0, max_wait=10)
    held = held_bucket(RPM, 3.0, 0.0)  # turns past the hold are dropped
    assert take(held, RPM, 1, 0.0, max_wait=10)[1].wait == 3.0
    burst = Rate(60, 60, 5)
    assert take(held_bucket(burst, 3.0, 0.0), burst, 1, 0.0, max_wait=10)[1].wait == 3.0


def test_lower_brings_a_bucket_down_never_up() -> None:
    state, _ = take(FULL, TPM, 50, 0.0, max_wait=0)  # 50 of 100 left
    assert lower(state, TPM, 80, 0.0) is None  # has 50: not raised to 80
    assert lower(state, TPM, 20, 0.0) == BucketState(80.0, 0.0)
    # no request may go for 7 s: the wait for one unit becomes 7 s
    lowered = lower(FULL, RPM, 0, 0.0, wait=7.0)
    assert lowered is not None
    _, decision = take(lowered, RPM, 1, 0.0, max_wait=10)
    assert decision.wait == 7.0


# -- paced buckets: a tiny capacity and a ceiling --------------------------------------

PACED = Rate(600, 60, 1.0, ceiling=600)  # ten tokens a second, one request ahead at most


def test_a_paced_bucket_lets_a_request_go_alone_once_drained() -> None:
    state, first = take(FULL, PACED, 30, 0.0, 0.0)
    assert first.allowed and first.wait == 0.0  # a drained bucket: any request goes now
    _, second = take(state, PACED, 5, 0.0, 10.0)
    assert second.allowed and second.wait == pytest.approx(3.0)  # after the 30 drained


def test_a_paced_bucket_refuses_only_beyond_its_ceiling() -> None:
    assert take(FULL, PACED, 600, 0.0, 0.0)[1].allowed
    assert take(FULL, PACED, 601, 0.0, 0.0)[1].admission is Admission.TOO_LARGE
    assert PACED.largest == 600 and Rate(10, 60, 5).largest == 5


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.floats(min_value=1.0, max_value=600.0), min_size=1, max_size=40),
    gaps=st.lists(st.floats(min_value=0.0, max_value=20.0), min_size=40, max_size=40),
)
def test_paced_tokens_never_exceed_the_pace_plus_one_request(
    costs: list[float], gaps: list[float]
) -> None:
    """Over any span of turns [s, e], at most rate x (e - s) plus the last request."""
    state, now, turns = FULL, 0.0, []
    for cost, gap in zip(costs, gaps, strict=False):
        now += gap
        state, decision = take(state, PACED, cost, now, 1e9)
        turns.append((now + decision.wait, cost))
    for i, (start, _) in enumerate(turns):
        for j in range(i, len(turns)):
            end = turns[j][0]
            sent = sum(c for _, c in turns[i : j + 1])
            assert sent <= (end - start) / PACED.interval + turns[j][1] + 1e-6
