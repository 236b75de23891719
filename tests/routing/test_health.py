"""Deployment health as a specification: failure windows, cooldowns, half-open probes and
the effective rate learned from 429s. Times are plain numbers: no clocks, no sleeps."""

from hypothesis import given
from hypothesis import strategies as st

from proxy.routing.health import (
    DECREASE,
    HEALTHY,
    MIN_FACTOR,
    CooldownRule,
    on_failure,
    on_success,
    rate_factor,
    start_probe,
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
