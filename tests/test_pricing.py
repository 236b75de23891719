"""A request's dollars: its real usage priced per kind of token, and the bound a budget reserves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.costs import TokenUsage
from proxy.money.pricing import FREE, Price, bound, dearest, usd

GPT_4O = Price(input=2.50, cached_input=1.25, output=10.00)
SONNET = Price(input=3.00, output=15.00, cache_read=0.30, cache_write=3.75)


def test_input_and_output_at_their_prices() -> None:
    assert usd(GPT_4O, TokenUsage(input_tokens=1_000_000, output_tokens=100_000)) == 3.5


def test_openai_cached_prompt_tokens_are_part_of_the_input_at_their_own_price() -> None:
    usage = TokenUsage(input_tokens=1000, cached_input=600, output_tokens=0)
    assert usd(GPT_4O, usage) == pytest.approx((400 * 2.50 + 600 * 1.25) / 1e6)


def test_anthropic_cache_writes_are_input_and_cache_reads_are_extra() -> None:
    usage = TokenUsage(input_tokens=1000, cache_write=800, cache_read=5000, output_tokens=10)
    expected = (200 * 3.00 + 800 * 3.75 + 5000 * 0.30 + 10 * 15.00) / 1e6
    assert usd(SONNET, usage) == pytest.approx(expected)


def test_a_cache_price_not_given_is_the_input_price() -> None:
    plain = Price(input=2.0, output=8.0)
    usage = TokenUsage(input_tokens=100, cached_input=50, cache_read=10, cache_write=20)
    assert usd(plain, usage) == pytest.approx((100 + 10) * 2.0 / 1e6)


def test_an_unpriced_deployment_costs_nothing() -> None:
    assert usd(FREE, TokenUsage(input_tokens=10**6, output_tokens=10**6)) == 0.0


def test_cache_counts_beyond_the_input_are_not_charged_twice() -> None:
    lying = TokenUsage(input_tokens=10, cached_input=50, cache_write=50)
    assert usd(GPT_4O, lying) == pytest.approx(10 * 1.25 / 1e6)


counts = st.integers(min_value=0, max_value=10**7)


@given(counts, counts, counts, counts, counts, st.sampled_from([GPT_4O, SONNET, FREE]))
def test_the_bound_covers_any_usage_within_the_token_bounds(
    plain: int, cached: int, written: int, read: int, output: int, price: Price
) -> None:
    usage = TokenUsage(
        input_tokens=plain + cached + written,
        cached_input=cached,
        cache_write=written,
        cache_read=read,
        output_tokens=output,
    )
    prompt = plain + cached + written + read
    assert usd(price, usage) <= bound(price, prompt, output) * (1 + 1e-12)


def test_the_dearest_price_covers_each_kind_of_token() -> None:
    top = dearest([GPT_4O, SONNET, FREE])
    assert (top.input, top.output) == (3.75, 15.0)
    assert dearest([]) == FREE
