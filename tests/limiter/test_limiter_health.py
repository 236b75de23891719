"""Deployment health as a specification: failure windows, cooldowns, half-open probes and
the effective rate learned from 429s. Times are plain numbers: no clocks, no sleeps."""

import math

from hypothesis import given
from hypothesis import strategies as st

from proxy.limiter import base
from proxy.limiter.health import (
    DECREASE,
    FORGET_AFTER,
    HEALTHY,
    MIN_FACTOR,
    CooldownRule,
    abandon_probe,
    expires_at,
    on_failure,
    on_success,
    probe_eligible,
    rate_factor,
    settle,
    start_probe,
    unusable_for,
    wait_for,
)

RULE = CooldownRule(allowed_fails=3, window=60.0, time=30.0)


def test_allowed_fails_within_the_window_cool_the_deployment() -> None:
    h, cooled = on_failure(HEALTHY, RULE, 0.0)
    assert not cooled and wait_for(h, 0.0) == 0.0
    h, cooled = on_failure(h, RULE, 10.0)
    assert not cooled
    h, cooled = on_failure(h, RULE, 20.0)
    assert cooled
    assert wait_for(h, 20.0) == 30.0
    assert wait_for(h, 45.0) == 5.0


def test_failures_older_than_the_window_do_not_count() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0)
    h, _ = on_failure(h, RULE, 1.0)
    h, cooled = on_failure(h, RULE, 61.5)
    assert not cooled
    assert len(h.failures) == 1


def test_after_a_cooldown_exactly_one_probe_goes_first() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, cool_for=5.0)
    assert wait_for(h, 5.0) == 0.0  # the cooldown is over: a probe may go
    h = start_probe(h, 5.0, probe_timeout=10.0)
    assert wait_for(h, 6.0) is None  # the probe is out: nobody else
    healthy = on_success(h, 7.0)
    assert wait_for(healthy, 7.0) == 0.0 and not healthy.cooling
    assert wait_for(h, 15.5) == 0.0  # a probe that never answered frees the slot


def test_a_failed_probe_or_a_failure_during_a_cooldown_cools_again() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, cool_for=5.0)
    h, cooled = on_failure(h, RULE, 2.0)
    assert cooled and h.cool_until == 32.0  # extended, never shortened
    h = start_probe(h, 32.0, probe_timeout=10.0)
    h, cooled = on_failure(h, RULE, 33.0)
    assert cooled and wait_for(h, 33.0) == 30.0


def test_a_success_while_healthy_changes_nothing() -> None:
    assert on_success(HEALTHY, 1.0) == HEALTHY


def test_upstream_429s_lower_the_rate_once_per_cooldown_and_it_recovers() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, cool_for=1.0, rate_limited=True)
    assert rate_factor(h, 0.0) == DECREASE
    h, _ = on_failure(h, RULE, 0.5, cool_for=1.0, rate_limited=True)  # same burst
    assert rate_factor(h, 0.5) > DECREASE * DECREASE
    h, _ = on_failure(h, RULE, 3.0, cool_for=1.0, rate_limited=True)  # a new signal
    assert rate_factor(h, 3.0) < DECREASE
    assert rate_factor(h, 10_000.0) == 1.0


@given(st.lists(st.floats(min_value=0, max_value=1000), max_size=60))
def test_the_factor_stays_between_its_floor_and_one(times: list[float]) -> None:
    h = HEALTHY
    for t in sorted(times):
        h, _ = on_failure(h, RULE, t, cool_for=0.0, rate_limited=True)
        assert MIN_FACTOR <= rate_factor(h, t) <= 1.0


def test_the_rule_is_the_limiters() -> None:
    assert CooldownRule is base.CooldownRule


def test_a_failure_exactly_one_window_old_no_longer_counts() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0)
    h, _ = on_failure(h, RULE, 1.0)
    h, cooled = on_failure(h, RULE, 60.0)
    assert not cooled and h.failures == (1.0, 60.0)


def test_unusable_for_and_probe_eligible() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, cool_for=5.0)
    assert unusable_for(h, 1.0) == 4.0 and not probe_eligible(h, 1.0)
    assert unusable_for(h, 5.0) == 0.0 and probe_eligible(h, 5.0)
    h = start_probe(h, 5.0, probe_timeout=10.0, lease_id="p")
    assert unusable_for(h, 6.0) == 9.0 and not probe_eligible(h, 6.0)
    assert unusable_for(HEALTHY, 6.0) == 0.0 and not probe_eligible(HEALTHY, 6.0)


def test_only_the_probes_own_abandonment_frees_the_slot() -> None:
    h, _ = on_failure(HEALTHY, RULE, 0.0, cool_for=5.0)
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


def test_expires_at_is_when_a_state_is_as_good_as_healthy() -> None:
    assert expires_at(HEALTHY, RULE.window) == -math.inf
    h, _ = on_failure(HEALTHY, RULE, 10.0)
    assert 70.0 < expires_at(h, RULE.window) < 72.0  # the failure leaves the window
    h, _ = on_failure(HEALTHY, RULE, 10.0, cool_for=5.0)
    assert expires_at(h, RULE.window) == 15.0 + FORGET_AFTER
    h, _ = on_failure(HEALTHY, RULE, 10.0, cool_for=0.0, rate_limited=True)
    h = on_success(h, 10.0)
    recovered_at = expires_at(h, RULE.window)
    assert rate_factor(h, recovered_at) == 1.0
    assert rate_factor(h, recovered_at - 2.0) < 1.0
