"""What a request costs, as data: its estimate per kind, and what it is charged after."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.costs import (
    MAX_COUNT,
    NOTHING,
    Counting,
    NoCount,
    TokenUsage,
    estimate_cost,
    negated,
    usage_cost,
    usage_count,
    without_cache_read,
)
from proxy.request.call import Trip
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


@given(st.integers(min_value=0, max_value=2**70))
def test_a_usage_count_is_an_integer_bounded_by_max_count(value: int) -> None:
    assert usage_count(value) == min(value, MAX_COUNT)
    as_orjson_reads_it = orjson.loads(str(value))  # a float beyond 64 bits
    assert usage_count(as_orjson_reads_it) == min(value, MAX_COUNT)


@given(
    st.one_of(
        st.integers(max_value=-1),
        st.floats(max_value=2.0**64, exclude_max=True),
        st.floats(allow_nan=True).filter(lambda f: f != f),
        st.floats(max_value=-1.0),
        st.booleans(),
        st.text(),
        st.lists(st.integers()),
    )
)
def test_anything_else_is_no_count(value: object) -> None:
    with pytest.raises(NoCount):
        usage_count(value)


def test_a_count_stated_nowhere_is_none() -> None:
    assert usage_count(None) is None


# --- how a provider's limits count (Counting); each provider's own: tests/providers -----

ESTIMATE = estimate_cost(1_000, 200)  # the whole prompt and the output cap


def test_a_limit_that_counts_cache_reads_is_charged_the_whole_estimate() -> None:
    counting = Counting(cache_reads=True)
    assert counting.admitted(ESTIMATE, 900) == ESTIMATE


def test_a_limit_that_does_not_count_cache_reads_is_charged_without_those_expected() -> None:
    cost = Counting(cache_reads=False).admitted(ESTIMATE, 900)
    assert cost == {"requests": 1.0, "tokens": 300.0, "input_tokens": 100.0, "output_tokens": 200}
    every = Counting(cache_reads=False).admitted(ESTIMATE, 5_000)  # never below no input
    assert (every["input_tokens"], every["tokens"]) == (0.0, 200.0)
    assert without_cache_read(ESTIMATE, 0) == ESTIMATE


def test_a_kept_count_is_charged_more_only_when_it_used_more() -> None:
    kept = Counting(cache_reads=True, adjusted=False)
    less = kept.counted(ESTIMATE, TokenUsage(input_tokens=800, output_tokens=10))
    assert less == ESTIMATE  # nothing given back
    more = kept.counted(ESTIMATE, TokenUsage(input_tokens=1_500, output_tokens=10))
    assert (more["input_tokens"], more["output_tokens"], more["tokens"]) == (1_500, 200, 1_700)


def test_an_adjusted_count_follows_the_usage_down_and_up() -> None:
    adjusted = Counting(cache_reads=False, adjusted=True)
    usage = TokenUsage(input_tokens=60, output_tokens=10, cache_read=940, cache_write=50)
    assert adjusted.counted(ESTIMATE, usage) == {
        "requests": 1.0,  # never corrected (the settlement skips it)
        "tokens": 70.0,
        "input_tokens": 60.0,
        "output_tokens": 10.0,
    }
    big = adjusted.counted(ESTIMATE, TokenUsage(input_tokens=3_000, output_tokens=150))
    assert (big["input_tokens"], big["tokens"]) == (3_000, 3_150)


def test_cache_reads_counted_where_the_limit_counts_them() -> None:
    usage = TokenUsage(input_tokens=60, output_tokens=10, cache_read=940)
    counted = Counting(cache_reads=True, adjusted=True).counted(ESTIMATE, usage)
    assert (counted["input_tokens"], counted["tokens"]) == (1_000, 1_010)


def test_a_kind_no_usage_tells_of_is_counted_as_estimated() -> None:
    estimate = {**ESTIMATE, "images": 3.0}
    usage = TokenUsage(input_tokens=10, output_tokens=1)
    assert Counting(adjusted=True).counted(estimate, usage)["images"] == 3.0
