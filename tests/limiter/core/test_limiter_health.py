"""Deployment health as a specification: failure windows, cooldowns, half-open probes,
holds after 429s and the rate learned from them. Times are plain numbers: no clocks, no
sleeps."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.limits import RULE

from proxy.limiter import base
from proxy.limiter.core.health import (
    DECREASE,
    FORGET_AFTER,
    GROWTH,
    HEALTHY,
    HOLD_WITHOUT_HINT,
    LEARNED_SPAN,
    MARGIN,
    MIN_RATE,
    PERIOD_IDLE,
    CooldownRule,
    Evidence,
    Health,
    abandon_probe,
    bounded_hold,
    counted,
    expires_at,
    hold_for,
    learned_rate,
    on_failure,
    on_rate_limited,
    on_success,
    probe_eligible,
    settle,
    start_probe,
    unusable_for,
    wait_for,
)


def test_allowed_fails_within_the_window_cool_the_deployment() -> None:
    h, cooled = on_failure(HEALTHY, RULE, 0.0, None)
    assert not cooled and wait_for(h, 0.0) == 0.0
    h, cooled = on_failure(h, RULE, 10.0, None)
    assert not cooled
    h, cooled = on_failure(h, RULE, 20.0, None)
    assert cooled
    assert wait_for(h, 20.0) == 30.0
    assert wait_for(h, 45.0) == 5.0


def test_failures_older_than_the_window_do_not_count() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, None)
    h, _ = on_failure(h, RULE, 1.0, None)
    h, cooled = on_failure(h, RULE, 61.5, None)
    assert not cooled
    assert len(h.failures) == 1


def test_after_a_cooldown_exactly_one_probe_goes_first() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, 5.0)
    assert wait_for(h, 5.0) == 0.0  # the cooldown is over: a probe may go
    h = start_probe(h, 5.0, probe_timeout=10.0)
    assert wait_for(h, 6.0) is None  # the probe is out: nobody else
    healthy = on_success(h, 7.0)
    assert wait_for(healthy, 7.0) == 0.0 and not healthy.cooling
    assert wait_for(h, 15.5) == 0.0  # a probe that never answered frees the slot


def test_a_failed_probe_or_a_failure_during_a_cooldown_cools_again() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, 5.0)
    h, cooled = on_failure(h, RULE, 2.0, None)
    assert cooled and h.cool_until == 32.0  # extended, never shortened
    h = start_probe(h, 32.0, probe_timeout=10.0)
    h, cooled = on_failure(h, RULE, 33.0, None)
    assert cooled and wait_for(h, 33.0) == 30.0


def test_a_success_while_healthy_changes_nothing() -> None:
    assert on_success(HEALTHY, 1.0) == HEALTHY


def _busy(turns: int, every: float, start: float = 0.0) -> Health:
    """A deployment that was granted ``turns`` turns ``every`` seconds from ``start``."""
    h = HEALTHY
    for i in range(turns):
        h = counted(h, start + i * every)
    return h


def test_a_429_holds_until_the_upstream_says_and_needs_no_probe() -> None:
    h = on_rate_limited(HEALTHY, 10.0, Evidence(hold=2.5))
    assert hold_for(h, 11.0) == 1.5 and unusable_for(h, 11.0) == 1.5
    assert wait_for(h, 11.0) == 0.0 and not h.cooling  # reservable, for after the hold
    assert hold_for(h, 12.5) == 0.0 and not probe_eligible(h, 12.5)
    without_hint = on_rate_limited(HEALTHY, 10.0, Evidence())
    assert hold_for(without_hint, 10.0) == HOLD_WITHOUT_HINT


def test_a_429_learns_the_rate_the_upstream_admitted() -> None:
    # 20 turns half a second apart from t=0; the 21st (sent at 10) got 429 "retry in 10":
    # a sliding window of 20 per 20 s, i.e. 1 request a second.
    h = _busy(21, 0.5)
    learned = on_rate_limited(h, 10.1, Evidence(0, 21, 10.0, pace=2.0, hold=10.0))
    assert learned.learned == MARGIN * 20 / 20.0
    assert learned.epoch == 1 and learned.sent == 0  # a new period, a new epoch
    assert learned.hold_until == 20.1 and learned.learned_at == 20.1
    # The other 429s of that overload (their turns were of epoch 0) only hold.
    again = on_rate_limited(learned, 10.2, Evidence(0, 22, 10.5, pace=2.0, hold=10.0))
    assert again.learned == learned.learned and again.epoch == 1


def test_a_429_while_a_learned_rate_is_in_force_lowers_it_by_margin_at_most() -> None:
    """The lesson of a 429 a tenth of a second into the period the previous lesson began
    (the upstream's window still full of the turns before it: a few turns measured over
    the hold): the rate in force lowered by MARGIN, not to the few turns measured."""
    first = on_rate_limited(_busy(41, 0.05), 2.0, Evidence(0, 41, 2.0, pace=20.0, hold=0.01))
    assert first.learned == pytest.approx(MARGIN * 40 / 2.01)  # a period from idle: as measured
    h = first
    for i in range(3):
        h = counted(h, 2.02 + i * 0.05)
    second = on_rate_limited(h, 2.13, Evidence(1, 3, 2.12, pace=20.0, hold=0.05))
    assert MARGIN * learned_rate(first, 2.13) > 2 / (0.1 + 0.05)  # what it measured: lower
    assert second.learned == pytest.approx(MARGIN * learned_rate(first, 2.13))
    assert second.epoch == 2


def test_a_429_never_raises_the_rate_in_force() -> None:
    h = _busy(11, 0.1)  # sent 10/s, but the configured pace is 1/s
    learned = on_rate_limited(h, 1.0, Evidence(0, 11, 1.0, pace=1.0, hold=0.0))
    assert learned.learned == 1.0


def test_a_429_with_nothing_measured_lowers_what_is_in_force_or_only_holds() -> None:
    first = counted(HEALTHY, 0.0)
    lowered = on_rate_limited(first, 0.0, Evidence(0, 1, 0.0, pace=2.0, hold=1.0))
    assert lowered.learned == DECREASE * 2.0
    unknown = on_rate_limited(first, 0.0, Evidence(0, 1, 0.0, pace=0.0, hold=1.0))
    assert unknown.learned == 0.0 and unknown.hold_until == 1.0


def test_the_learned_rate_grows_and_is_forgotten_once_doubled() -> None:
    h = on_rate_limited(_busy(11, 1.0), 10.0, Evidence(0, 11, 10.0, hold=0.0))
    rate = MARGIN * 10 / 10.0
    assert learned_rate(h, 10.0) == rate
    assert learned_rate(h, 20.0) == rate * (1 + GROWTH * 10)
    doubled_at = 10.0 + (LEARNED_SPAN - 1.0) / GROWTH
    assert learned_rate(h, doubled_at - 1) > rate and learned_rate(h, doubled_at) == 0.0
    assert expires_at(h, RULE.window) >= doubled_at


def test_a_period_ends_after_idling() -> None:
    h = _busy(5, 1.0)
    assert (h.sent, h.sent_from) == (5, 0.0)
    h = counted(h, 4.0 + PERIOD_IDLE + 1)
    assert (h.sent, h.sent_from) == (1, 4.0 + PERIOD_IDLE + 1)


@pytest.mark.slow
@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(0, 50), st.floats(0, 30)), max_size=60))
def test_learning_never_raises_and_never_drops_below_its_floor(
    events: list[tuple[float, int, float]],
) -> None:
    h, now = HEALTHY, 0.0
    for gap, turns, hold in events:
        now += gap
        for _ in range(turns):
            h = counted(h, now)
        before, epoch = learned_rate(h, now) or 4.0, h.epoch
        h = on_rate_limited(h, now, Evidence(h.epoch, h.sent, now, pace=4.0, hold=hold))
        if h.epoch != epoch:  # it learned
            assert MIN_RATE <= learned_rate(h, now) <= before


def test_the_rule_is_the_limiters() -> None:
    assert CooldownRule is base.CooldownRule


def test_a_failure_exactly_one_window_old_no_longer_counts() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, None)
    h, _ = on_failure(h, RULE, 1.0, None)
    h, cooled = on_failure(h, RULE, 60.0, None)
    assert not cooled and h.failures == (1.0, 60.0)


def test_unusable_for_and_probe_eligible() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, 5.0)
    assert unusable_for(h, 1.0) == 4.0 and not probe_eligible(h, 1.0)
    assert unusable_for(h, 5.0) == 0.0 and probe_eligible(h, 5.0)
    h = start_probe(h, 5.0, probe_timeout=10.0, lease_id="p")
    assert unusable_for(h, 6.0) == 9.0 and not probe_eligible(h, 6.0)
    assert unusable_for(HEALTHY, 6.0) == 0.0 and not probe_eligible(HEALTHY, 6.0)


def test_only_the_probes_own_abandonment_frees_the_slot() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, 5.0)
    h = start_probe(h, 5.0, probe_timeout=10.0, lease_id="p")
    assert abandon_probe(h, "other") is h
    assert abandon_probe(h, "") is h
    freed = abandon_probe(h, "p")
    assert freed.cooling and probe_eligible(freed, 6.0)
    assert abandon_probe(HEALTHY, "p") is HEALTHY


def test_settle_maps_outcomes_to_changes() -> None:
    fail = base.Outcome("failure", "timeout")
    h, change = settle(HEALTHY, fail, RULE, 0.0)
    assert change == base.HealthChange() and h.failures == (0.0,)
    h, change = settle(h, base.Outcome("failure", "auth", cool_for=5.0), RULE, 1.0)
    assert change == base.HealthChange(cooled=True, cool_for=5.0)
    same, change = settle(h, base.Outcome("success"), RULE, 2.0)  # still cooling
    assert same is h and change == base.HealthChange(cool_for=4.0)
    same, change = settle(h, base.Outcome("neutral"), RULE, 2.0, "any")
    assert same is h and not change.cooled
    healthy, change = settle(h, base.Outcome("success"), RULE, 6.0)  # the probe's answer
    assert change == base.HealthChange(recovered=True) and not healthy.cooling
    limited = base.Outcome("failure", "rate_limited", cool_for=3.0, rate_limited=True)
    h, change = settle(_busy(3, 1.0), limited, RULE, 2.0, evidence=Evidence(0, 3, 2.0))
    assert change == base.HealthChange(cooled=True, cool_for=3.0, epoch=1)
    assert h.learned == MARGIN * 2 / 5.0


def test_no_hold_an_upstream_asks_for_outlasts_the_rules_max_hold() -> None:
    """An infinite, absurd or negative hold is cut to [0, max_hold]; a NaN says
    nothing (the hold without a hint)."""
    rule = CooldownRule(allowed_fails=3, window=60.0, time=30.0, max_hold=300.0)
    for asked, held in ((math.inf, 300.0), (1e12, 300.0), (86_400.0, 300.0), (-5.0, 0.0)):
        limited = base.Outcome("failure", "rate_limited", cool_for=asked, rate_limited=True)
        h, change = settle(HEALTHY, limited, rule, 10.0)
        assert h.hold_until == 10.0 + held and change.cool_for == held, asked
        assert expires_at(h, rule.window) <= 10.0 + held + 1.0
    nan = base.Outcome("failure", "rate_limited", cool_for=math.nan, rate_limited=True)
    h, _ = settle(HEALTHY, nan, rule, 10.0)
    assert h.hold_until == 10.0 + HOLD_WITHOUT_HINT


def test_bounded_hold() -> None:
    assert bounded_hold(None, 5.0) is None and bounded_hold(math.nan, 5.0) is None
    assert bounded_hold(2.5, 5.0) == 2.5 and bounded_hold(-math.inf, 5.0) == 0.0
    assert bounded_hold(math.inf, 5.0) == 5.0


def test_a_learning_429_with_an_absurd_hold_learns_within_the_bound() -> None:
    """The learned rate counts the bounded hold, never a century (which would have
    taught the floor of one request a minute)."""
    rule = CooldownRule(allowed_fails=3, window=60.0, time=30.0, max_hold=2.0)
    limited = base.Outcome("failure", "rate_limited", cool_for=1e12, rate_limited=True)
    h, _ = settle(_busy(3, 1.0), limited, rule, 2.0, evidence=Evidence(0, 3, 2.0))
    assert h.learned == MARGIN * 2 / 4.0 and h.hold_until == 4.0


def test_expires_at_is_when_a_state_is_as_good_as_healthy() -> None:
    assert expires_at(HEALTHY, RULE.window) == -math.inf
    h, _ = on_failure(HEALTHY, RULE, 10.0, None)
    assert 70.0 < expires_at(h, RULE.window) < 72.0  # the failure leaves the window
    h, _ = on_failure(HEALTHY, RULE, 10.0, 5.0)
    assert expires_at(h, RULE.window) == 15.0 + FORGET_AFTER
    held = on_rate_limited(HEALTHY, 10.0, Evidence(hold=2.0))
    assert 12.0 < expires_at(held, RULE.window) < 14.0  # the hold is over
    busy = counted(HEALTHY, 10.0)
    assert 10.0 + PERIOD_IDLE < expires_at(busy, RULE.window) < 12.0 + PERIOD_IDLE
