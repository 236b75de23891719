"""Reading an upstream's budget and retry hints from its headers: strictly, finite, and
bounded where they hold a deployment (``server.max_upstream_hold``)."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.providers.ratelimits import parse_budget, remaining_report, retry_after
from proxy.upstream.outcomes import admitted, classify_status

NOW = 1_800_000_000.0
MAX_HOLD = 300.0


def test_openai_headers() -> None:
    budget = parse_budget(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "150000",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        NOW,
    )
    assert budget.remaining_requests == 499 and budget.limit_requests == 500
    assert budget.reset_requests == 0.12
    assert budget.remaining_tokens == 150_000 and budget.reset_tokens == 360.0


def test_anthropic_headers_with_rfc3339_resets() -> None:
    budget = parse_budget(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30Z",
        },
        NOW,
    )
    assert budget.remaining_requests == 0
    assert budget.reset_requests is not None and budget.reset_requests > 0


def test_anthropics_input_and_output_token_limits_are_read_apart() -> None:
    budget = parse_budget(
        {
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "1200",
            "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:00:30Z",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "8000",
            "anthropic-ratelimit-output-tokens-reset": "2027-01-15T08:00:00+00:00",
        },
        NOW,
    )
    assert budget.limit_input_tokens == 40_000 and budget.remaining_input_tokens == 1200
    assert budget.limit_output_tokens == 8000 and budget.remaining_output_tokens == 8000
    assert budget.reset_input_tokens is not None and budget.reset_output_tokens is not None
    assert not budget.empty and len(budget.resets) == 2


def test_anthropics_input_tokens_running_low_floor_the_input_token_windows() -> None:
    from proxy.limiter.base import MINUTE, DeploymentLimits, Rate, Window
    from proxy.limiter.core.verdicts import floors

    budget = parse_budget(
        {
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "1200",  # 3%: low
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "8000",
        },
        NOW,
    )
    report = remaining_report(budget, MAX_HOLD)
    assert report is not None and report.input_tokens == 1200 and report.output_tokens == 8000
    windows = tuple(
        Window(name, kind, Rate(40_000, MINUTE, 1.0))
        for name, kind in (("itpm", "input_tokens"), ("otpm", "output_tokens"), ("rpm", "requests"))
    )
    lowered = floors(DeploymentLimits("d", windows), report, MAX_HOLD)
    assert [(f.window.name, f.available) for f in lowered] == [("itpm", 1200), ("otpm", 8000)]
    assert report.shared(2).input_tokens == 600


@pytest.mark.parametrize(
    "reset", ["30s", "1e3", "2027-01-15", "2027-01-15T08:00:30", "2027-13-15T08:00:30Z", "soon"]
)
def test_an_anthropic_reset_is_an_rfc3339_time_or_unknown(reset: str) -> None:
    budget = parse_budget(
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": reset,
        },
        NOW,
    )
    assert budget.remaining_requests == 0 and budget.reset_requests is None


def test_no_headers_is_empty() -> None:
    assert parse_budget({"content-type": "application/json"}, NOW).empty


def test_retry_after_prefers_milliseconds() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "2"}, NOW) == 1.5
    assert retry_after({"retry-after": "3"}, NOW) == 3.0
    assert retry_after({"retry-after": "Thu, 01 Jan 2027 00:00:00 GMT"}, NOW) is not None
    assert retry_after({"retry-after": "soon"}, NOW) is None
    assert retry_after({}, NOW) is None


def test_azure_sends_only_what_is_left_and_the_configured_limits_judge_it() -> None:
    budget = parse_budget(
        {"x-ratelimit-remaining-requests": "4", "x-ratelimit-remaining-tokens": "61353"}, NOW
    )
    assert (budget.remaining_requests, budget.remaining_tokens) == (4, 61353)
    assert budget.limit_requests is None and budget.reset_requests is None
    assert remaining_report(budget, MAX_HOLD) is None  # no limit known: 4 left is not "low"
    report = remaining_report(budget.assuming(100, 80_000), MAX_HOLD)
    assert report is not None and report.requests == 4  # 4 of 100 is low
    # An announced limit wins over the configured one.
    announced = parse_budget(
        {"x-ratelimit-limit-requests": "1000", "x-ratelimit-remaining-requests": "4"}, NOW
    )
    assert announced.assuming(100, None).limit_requests == 1000


def test_azure_minus_one_means_unknown_not_exhausted() -> None:
    budget = parse_budget(
        {
            "x-ratelimit-limit-tokens": "-1",
            "x-ratelimit-remaining-tokens": "-1",
            "x-ratelimit-reset-tokens": "0",
        },
        NOW,
    )
    assert budget.remaining_tokens is None and budget.limit_tokens is None
    assert remaining_report(budget.assuming(None, 1000), MAX_HOLD) is None


def test_an_azure_429_without_retry_after_says_when_in_x_rate_limit_reset_tokens() -> None:
    headers = {"x-rate-limit-reset-tokens": "55", "x-ratelimit-remaining-requests": "79"}
    assert retry_after(headers, NOW) is None
    assert parse_budget(headers, NOW).reset_tokens == 55.0
    outcome = classify_status(
        429, headers, parse_budget(headers, NOW), NOW, cooldown_time=30.0, max_hold=MAX_HOLD
    )
    assert outcome.cool_for == 55.0 and outcome.rate_limited


def test_an_azure_429_with_retry_after_ms_and_retry_after() -> None:
    headers = {"retry-after-ms": "2500", "retry-after": "3"}
    assert (
        classify_status(
            429, headers, parse_budget(headers, NOW), NOW, cooldown_time=30.0, max_hold=MAX_HOLD
        ).cool_for
        == 2.5
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "inf"},
        {"retry-after": "nan"},
        {"retry-after-ms": "inf"},
        {"retry-after-ms": "NaN", "retry-after": "Infinity"},
        {"retry-after": "1e999"},
    ],
)
def test_a_non_finite_retry_hint_is_as_if_not_sent(headers: dict[str, str]) -> None:
    assert retry_after(headers, NOW) is None
    outcome = classify_status(
        429, headers, parse_budget(headers, NOW), NOW, cooldown_time=30.0, max_hold=MAX_HOLD
    )
    assert outcome.cool_for is None and outcome.rate_limited  # the hold without a hint


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "1e12"},
        {"retry-after": "86400"},
        {"retry-after-ms": "1e30"},
        {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999999h0m0s"},
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1e12"},
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
        },
    ],
)
def test_a_429_holds_at_most_max_upstream_hold(headers: dict[str, str]) -> None:
    outcome = classify_status(
        429, headers, parse_budget(headers, NOW), NOW, cooldown_time=30.0, max_hold=MAX_HOLD
    )
    assert outcome.cool_for == MAX_HOLD


def test_non_finite_or_negative_budget_figures_are_unknown() -> None:
    budget = parse_budget(
        {
            "x-ratelimit-limit-requests": "inf",
            "x-ratelimit-remaining-requests": "nan",
            "x-ratelimit-limit-tokens": "1e999",
            "x-ratelimit-remaining-tokens": "-inf",
            "x-ratelimit-reset-tokens": "inf",
        },
        NOW,
    )
    assert budget == type(budget)()
    anthropic = parse_budget(
        {
            "anthropic-ratelimit-requests-limit": "-5",
            "anthropic-ratelimit-requests-remaining": "-1",
            "anthropic-ratelimit-tokens-remaining": "inf",
        },
        NOW,
    )
    assert anthropic.remaining_requests is None and anthropic.limit_requests is None
    assert anthropic.remaining_tokens is None


def test_when_the_next_request_frees_up_is_at_most_max_upstream_hold() -> None:
    budget = parse_budget(
        {
            "x-ratelimit-limit-requests": "10",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "1e12",
        },
        NOW,
    )
    report = remaining_report(budget, MAX_HOLD)
    assert report is not None and report.requests == 0 and report.requests_wait == MAX_HOLD


@pytest.mark.parametrize(
    ("status", "counted"),
    [
        (400, False),
        (404, False),
        (413, False),
        (422, False),
        (200, True),
        (401, True),
        (429, True),
        (500, True),
    ],
)
def test_what_the_upstream_did_not_admit_is_not_counted(status: int, counted: bool) -> None:
    assert admitted(status) is counted


HEADER_NAMES = [
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-rate-limit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
]
header_values = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["inf", "-inf", "nan", "1e999", "1e12", "-1", "9" * 400, "6m0s", "1h"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
    st.datetimes().map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")),
)


@pytest.mark.slow
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(HEADER_NAMES), header_values))
def test_whatever_an_upstream_sends_every_figure_is_finite_and_every_hold_bounded(
    headers: dict[str, str],
) -> None:
    budget = parse_budget(headers, NOW)
    for figure in (
        budget.limit_requests,
        budget.remaining_requests,
        budget.reset_requests,
        budget.limit_tokens,
        budget.remaining_tokens,
        budget.reset_tokens,
    ):
        assert figure is None or (math.isfinite(figure) and figure >= 0), budget
    hint = retry_after(headers, NOW)
    assert hint is None or (math.isfinite(hint) and hint >= 0)
    outcome = classify_status(
        429, headers, parse_budget(headers, NOW), NOW, cooldown_time=30.0, max_hold=MAX_HOLD
    )
    assert outcome.cool_for is None or 0 <= outcome.cool_for <= MAX_HOLD
    report = remaining_report(budget.assuming(100, 1000), MAX_HOLD)
    if report is not None and report.requests_wait is not None:
        assert 0 <= report.requests_wait <= MAX_HOLD
