"""What a request costs, as data: its estimate per kind, and what it is charged after."""

from __future__ import annotations

from proxy.call import Trip
from proxy.costs import NOTHING, TokenUsage, estimate_cost, negated, usage_cost
from proxy.shapes.chat import CHAT
from proxy.shapes.embeddings import EMBEDDINGS


def test_an_estimate_is_one_request_its_input_and_its_output_apart_and_together() -> None:
    assert estimate_cost(300, 100) == {
        "requests": 1.0,
        "tokens": 400.0,
        "input_tokens": 300.0,
        "output_tokens": 100.0,
    }


def test_a_request_body_is_estimated_prompt_as_input_and_its_cap_as_output() -> None:
    body = {"messages": [], "max_tokens": 10, "n": 2}
    cost = CHAT.estimate(body, 256)
    assert (cost["input_tokens"], cost["output_tokens"], cost["tokens"]) == (3.0, 20.0, 23.0)
    embedding = EMBEDDINGS.estimate({"input": "abcd"}, 256)
    assert (embedding["output_tokens"], embedding["tokens"]) == (0.0, 2.0)


def test_given_back_is_every_kind_negated() -> None:
    assert negated({"requests": 1.0, "tokens": 5.0}) == {"requests": -1.0, "tokens": -5.0}


def test_nothing_is_an_empty_hashable_cost() -> None:
    assert dict(NOTHING) == {} and NOTHING.get("tokens", 0.0) == 0.0
    assert hash(NOTHING) == hash(NOTHING)


def test_real_usage_settles_every_token_kind() -> None:
    usage = TokenUsage(input_tokens=100, output_tokens=20, cache_read=5)
    assert usage_cost(usage) == {"tokens": 125.0, "input_tokens": 100.0, "output_tokens": 20.0}


def test_a_call_is_charged_its_reported_usage_else_a_streams_unreported_count() -> None:
    estimate = estimate_cost(30, 100)
    trip = Trip()
    assert trip.charged_cost(estimate) is None  # unknown: the estimate goes back
    trip.unreported_tokens = 50  # a stream cut before its usage: input first, then output
    assert trip.charged_cost(estimate) == {
        "tokens": 50.0,
        "input_tokens": 30.0,
        "output_tokens": 20.0,
    }
    trip.reported(TokenUsage(input_tokens=12, output_tokens=7))  # where usage is read
    assert trip.charged_cost(estimate) == {
        "tokens": 19.0,
        "input_tokens": 12.0,
        "output_tokens": 7.0,
    }


def test_cache_reads_are_not_charged_as_input_but_count_in_tokens() -> None:
    """Anthropic's rule: uncached input and cache writes count toward its input-token
    limit, cache reads do not (docs/limiter.md)."""
    trip = Trip()
    trip.reported(TokenUsage(25, 16, cache_read=300, cache_write=5))
    assert trip.charged_cost(estimate_cost(400, 100)) == {
        "tokens": 341.0,
        "input_tokens": 25.0,
        "output_tokens": 16.0,
    }
