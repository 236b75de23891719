"""Reading an upstream's budget and retry hints from its headers."""

from proxy.upstream.ratelimits import parse_budget, retry_after

NOW = 1_800_000_000.0


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


def test_no_headers_is_empty() -> None:
    assert parse_budget({"content-type": "application/json"}, NOW).empty


def test_retry_after_prefers_milliseconds() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "2"}, NOW) == 1.5
    assert retry_after({"retry-after": "3"}, NOW) == 3.0
    assert retry_after({"retry-after": "Thu, 01 Jan 2027 00:00:00 GMT"}, NOW) is not None
    assert retry_after({"retry-after": "soon"}, NOW) is None
    assert retry_after({}, NOW) is None
