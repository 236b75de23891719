"""The pacing margin measured (catalog/pacing.py): a percentile of how late turns leave
over a sliding period, widened at once, narrowed slowly, bounded; the largest need of
the live replicas in force. Pure: an injected clock."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.catalog.pacing import (
    COMPRESSION,
    HALF_LIFE,
    HEARD_FOR,
    INITIAL_MARGIN,
    MAX_MARGIN,
    MIN_MARGIN,
    NETWORK_MARGIN,
    PERIOD,
    RESERVE,
    STEP,
    Lateness,
    Pacing,
    in_steps,
    pacing_headroom,
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_before_anything_is_measured_the_margin_is_the_initial_one() -> None:
    lateness = Lateness(Clock())
    assert lateness.need() == INITIAL_MARGIN
    assert lateness.percentile() is None


def test_the_need_narrows_slowly_to_what_the_turns_show() -> None:
    """Turns 2 ms late: the initial 50 ms halves every HALF_LIFE, never below 2 ms."""
    clock = Clock()
    lateness = Lateness(clock)
    needs = []
    for _ in range(600):  # a minute of turns, ten a second
        clock.now += 0.1
        lateness.record(0.002)
        needs.append(lateness.need())
    assert all(a >= b for a, b in itertools.pairwise(needs))  # never widens
    after_one_half_life = needs[int(HALF_LIFE / 0.1) - 1]
    assert after_one_half_life == pytest.approx(INITIAL_MARGIN / 2, rel=0.01)
    assert needs[-1] == pytest.approx(0.002, abs=0.0005)  # the bin's edge: 2-2.5 ms


def test_turns_later_than_the_margin_widen_it_at_once() -> None:
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    lateness.record(0.001)
    assert lateness.need() <= 0.0015
    lateness.record(0.047)  # a stall: with two turns measured, the percentile is it
    assert lateness.need() >= 0.047
    clock.now += HALF_LIFE
    assert lateness.need() >= 0.047  # still in the period's percentile: kept


def test_one_stall_beyond_the_percentile_does_not_widen_it() -> None:
    """Among 500 turns 3 ms late, one 80 ms late is beyond the 99th percentile: the
    margin stays (that turn is not sent: the dispatcher's check); five such do widen."""
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    for _ in range(500):
        clock.now += 0.01
        lateness.record(0.003)
    lateness.record(0.08)
    assert lateness.need() == pytest.approx(0.0035)
    for _ in range(5):
        lateness.record(0.08)
    assert lateness.need() == pytest.approx(0.0805)


def test_stalls_narrow_once_out_of_the_period() -> None:
    """Stalls that made the percentile widen the margin: once they have left the period,
    it halves every HALF_LIFE, down to what the other turns need."""
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    for i in range(500):
        clock.now += 0.01
        lateness.record(0.08 if i % 50 == 0 else 0.003)  # 2% of the turns stall
    assert lateness.need() == pytest.approx(0.0805)
    for _ in range(int(PERIOD / 0.05)):  # a period without stalls
        clock.now += 0.05
        lateness.record(0.003)
    assert lateness.need() < 0.0805 * 0.5 ** (PERIOD / HALF_LIFE - 1)
    for _ in range(400):
        clock.now += 0.05
        lateness.record(0.003)
    assert lateness.need() == pytest.approx(0.0035)  # its bin's upper edge


def test_the_period_slides() -> None:
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    for _ in range(100):
        clock.now += 0.05
        lateness.record(0.03)
    assert lateness.percentile() == pytest.approx(0.0305)
    clock.now += PERIOD + 1.0  # nothing recorded since: the period is empty
    assert lateness.percentile() is None


def test_the_need_is_bounded() -> None:
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    lateness.record(5.0)  # a process swapped out for seconds
    assert lateness.need() == MAX_MARGIN
    clock.now += 100 * PERIOD
    assert lateness.need() == MIN_MARGIN
    lateness.record(-0.01)  # early: on time
    assert lateness.need() == MIN_MARGIN


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 2.0), st.floats(-0.01, 0.2)),
        min_size=1,
        max_size=200,
    )
)
def test_the_need_covers_the_quantile_of_the_period_and_stays_bounded(
    turns: list[tuple[float, float]],
) -> None:
    """Whatever the turns, the need is within the bounds, at least the period's
    percentile, and never narrower than before when no time passed."""
    clock = Clock()
    lateness = Lateness(clock, initial=MIN_MARGIN)
    for gap, late in turns:
        clock.now += gap
        before = lateness.need()
        lateness.record(late)
        need = lateness.need()
        assert MIN_MARGIN <= need <= MAX_MARGIN
        assert need >= min(before, MAX_MARGIN) - 1e-12  # no time passed: never narrower
        percentile = lateness.percentile()
        assert percentile is not None
        assert need >= min(percentile, MAX_MARGIN)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=1, max_size=50))
def test_narrowing_is_never_faster_than_halving_every_half_life(gaps: list[float]) -> None:
    clock = Clock()
    lateness = Lateness(clock, initial=MAX_MARGIN)
    need = lateness.need()
    for gap in gaps:
        clock.now += gap
        now = lateness.need()
        assert now >= need * 0.5 ** (gap / HALF_LIFE) * (1 - 1e-9)
        need = now


def test_in_steps_never_rounds_down() -> None:
    assert in_steps(0.0101) == pytest.approx(0.011)
    assert in_steps(0.011) == pytest.approx(0.011)
    assert in_steps(0.001) == pytest.approx(STEP)


def test_the_headroom_covers_the_margin_and_at_least_the_one_percent() -> None:
    """N + 1 turns paced for a margin m span 1 s + m; below 10.1 ms the 1% stands."""
    assert pacing_headroom(0.0) == pytest.approx(0.01)
    assert pacing_headroom(0.005) == pytest.approx(0.01)  # the 1% covers it
    assert pacing_headroom(NETWORK_MARGIN) == pytest.approx(0.01)
    assert pacing_headroom(0.05) == pytest.approx(1 - 1 / 1.05)  # not 0.99 / 1.05
    for margin in (0.0, 0.003, 0.02, 0.05, 0.1):
        paced = 10 * (1 - pacing_headroom(margin))  # 10 a second
        span = 10 / paced  # 11 turns, 10 intervals
        assert span >= 1.0 + margin - 1e-9


def test_the_margin_in_force_is_the_largest_need_of_the_live_replicas() -> None:
    clock = Clock()
    pacing = Pacing(None, "a", clock, Lateness(clock, initial=0.004))
    assert pacing.in_force().margin == pytest.approx(0.004 + RESERVE)
    assert pacing.in_force().replica == "a"
    pacing.heard({"a": 0.09, "b": 0.0123, "c": 0.002})  # its own id: skipped
    force = pacing.in_force()
    assert force.margin == pytest.approx(0.015)  # 12.3 + 2 ms, in whole steps, rounded up
    assert force.replica == "b"
    assert force.auto
    clock.now += HEARD_FOR + 1.0  # b no longer heard: not alive
    assert pacing.margin() < 0.015
    assert pacing.in_force().replica == "a"


def test_a_late_turn_here_widens_the_margin_in_force_at_once() -> None:
    clock = Clock()
    pacing = Pacing(None, "a", clock, Lateness(clock, initial=MIN_MARGIN))
    version = pacing.version
    pacing.record(0.0301)  # the one turn measured: the percentile
    assert pacing.margin() == pytest.approx(0.033)  # no refresh period waited; + RESERVE
    assert pacing.version > version
    assert pacing.own() == pytest.approx(0.0305)  # its bin's upper edge


def test_a_fixed_margin_is_used_as_it_is_and_measures_nothing() -> None:
    clock = Clock()
    pacing = Pacing(0.02, "a", clock)
    pacing.record(0.09)
    pacing.heard({"b": 0.1})
    assert pacing.in_force().margin == 0.02
    assert not pacing.in_force().auto
    assert pacing.own() is None  # nothing shared
    pacing.set_fixed(None)  # a reload to auto
    assert pacing.in_force().auto
    pacing.set_fixed(0.0)
    assert pacing.margin() == 0.0


def test_what_every_replica_paces_with_lags_a_widening_by_the_heartbeats() -> None:
    """A need widened here reaches the others with the heartbeats: until HEARD_FOR has
    passed, the margin agreed on is the one before (the least in force over it)."""
    clock = Clock()
    pacing = Pacing(None, "a", clock, Lateness(clock, initial=0.005))
    assert pacing.agreed() == 0.0  # just started: the others know nothing of it yet
    assert pacing.own() is None  # nor are told of a need it has not measured
    clock.now += 2 * HEARD_FOR
    assert pacing.agreed() == pacing.margin()
    pacing.record(0.004)
    before = pacing.margin()
    pacing.record(0.06)
    assert pacing.margin() == pytest.approx(0.063)  # its bin's edge + RESERVE, in steps
    assert pacing.agreed() == before
    clock.now += HEARD_FOR + 0.1
    assert pacing.agreed() == pacing.margin()


def test_the_margin_in_force_narrows_no_faster_than_the_turns_reserved_ahead_allow() -> None:
    """A narrowing brings the turns reserved after it closer to those before by what it
    narrows times how far ahead they are reserved: at most COMPRESSION a second, whatever
    the needs (a stalled replica that leaves included)."""
    clock = Clock()
    pacing = Pacing(None, "a", clock, Lateness(clock, initial=MIN_MARGIN), depth=2.0)
    pacing.heard({"b": 0.08})
    assert pacing.margin() == pytest.approx(0.082)
    before = pacing.margin()
    for _ in range(40):  # b gone: its need no longer counts, and a's is 1 ms
        clock.now += 0.5
        now = pacing.margin()
        assert before - now <= COMPRESSION / 2.0 * 0.5 + STEP + 1e-9
        before = now
    assert pacing.margin() < 0.082
    clock.now += 1000.0
    assert pacing.margin() == pytest.approx(MIN_MARGIN + RESERVE)


def test_before_any_turn_the_need_stays_the_initial_one() -> None:
    clock = Clock()
    lateness = Lateness(clock)
    clock.now += 10 * HALF_LIFE
    assert lateness.need() == INITIAL_MARGIN
