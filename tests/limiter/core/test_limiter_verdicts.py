"""Corrections per kind (verdicts.py): what a request is charged after the fact; the
verdict of a request a lease admitted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.limits import window

from proxy.costs import estimate_cost
from proxy.limiter.core.bucket import Admission, BucketState, Decision
from proxy.limiter.core.verdicts import (
    admitted_verdict,
    excess_cost,
    key_verdict,
    settled_cost,
    spends,
)

WINDOWS = (window("tokens", 1000), window("input_tokens", 800), window("output_tokens", 300))
ESTIMATE = estimate_cost(100, 200)


def test_a_key_is_corrected_to_what_it_used_per_kind_but_requests() -> None:
    used = {"tokens": 150.0, "input_tokens": 120.0, "output_tokens": 30.0}
    assert settled_cost(ESTIMATE, used, WINDOWS) == {
        "tokens": -150.0,
        "input_tokens": 20.0,
        "output_tokens": -170.0,
    }


def test_unknown_usage_gives_the_whole_estimate_back() -> None:
    assert settled_cost(ESTIMATE, None, WINDOWS) == {
        "tokens": -300.0,
        "input_tokens": -100.0,
        "output_tokens": -200.0,
    }


def test_a_count_no_request_could_use_is_believed_as_far_as_one_could() -> None:
    used = {"tokens": 1e12, "input_tokens": 1e12, "output_tokens": 1e12}
    assert settled_cost(ESTIMATE, used, WINDOWS) == {
        "tokens": 700.0,  # up to the 1,000 one request can take
        "input_tokens": 700.0,
        "output_tokens": 100.0,
    }


def test_a_deployment_is_never_refunded_only_charged_more() -> None:
    used = {"tokens": 350.0, "input_tokens": 50.0, "output_tokens": 300.0}
    assert settled_cost(ESTIMATE, used, WINDOWS, refund=False) == {
        "tokens": 50.0,
        "output_tokens": 100.0,
    }
    assert not settled_cost(ESTIMATE, None, WINDOWS, refund=False)


def test_a_kind_no_window_counts_has_nothing_to_correct() -> None:
    used = {"tokens": 150.0, "input_tokens": 120.0, "output_tokens": 30.0}
    tokens_only = (window("requests", 10), window("tokens", 1000))
    assert settled_cost(ESTIMATE, used, tokens_only) == {"tokens": -150.0}
    assert settled_cost(ESTIMATE, None, (window("requests", 10),)) == {}


def test_a_leases_excess_comes_back_as_the_largest_per_kind() -> None:
    windows = (window("tokens", 1000), window("tokens", 5000, 86400.0), window("requests", 10))
    assert excess_cost(windows, [5.0, 8.0, 0.0]) == {"tokens": 8.0}


@pytest.mark.slow
@given(
    st.lists(st.floats(0.0, 2000.0), min_size=3, max_size=3),
    st.integers(1, 3),
    st.floats(0.0, 100.0),
)
def test_an_admitted_verdict_is_key_verdicts_for_an_allowed_request(
    debts: list[float], own: int, now: float
) -> None:
    states = [BucketState(d, 0.0) for d in debts]
    spent = spends(WINDOWS, ESTIMATE)
    allowed = Decision(Admission.ALLOWED)
    assert admitted_verdict(WINDOWS, states, now, own) == key_verdict(
        spent, allowed, "", states, now, own
    )
