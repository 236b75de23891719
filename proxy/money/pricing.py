"""What a request costs in dollars: its usage priced (pure).

A price is USD per million tokens, per kind of token. OpenAI's cached prompt tokens are
part of its input tokens at their own price; Anthropic's cache writes are part of its
input tokens, its cache reads are not (``costs.TokenUsage``). A cache price not given is
the input price. An unpriced deployment costs 0 (``config_warnings`` names a budget in
dollars over one).
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.costs import TokenUsage
from proxy.values import value

PER = 1_000_000.0  # prices are per million tokens


@value
class Price:
    """USD per 1M tokens; None: a cache price that is the input price."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None

    def _or_input(self, price: float | None) -> float:
        return self.input if price is None else price


FREE = Price()


def usd(price: Price, usage: TokenUsage) -> float:
    """The dollars ``usage`` costs at ``price``. Inputs the upstream says are cached or
    cache writes are never counted twice, and no count below zero is charged."""
    cached = min(usage.cached_input, usage.input_tokens)
    written = min(usage.cache_write, usage.input_tokens - cached)
    plain = usage.input_tokens - cached - written
    total = (
        plain * price.input
        + cached * price._or_input(price.cached_input)
        + written * price._or_input(price.cache_write)
        + max(0, usage.cache_read) * price._or_input(price.cache_read)
        + usage.output_tokens * price.output
    )
    return max(0.0, total) / PER


def bound(price: Price, input_tokens: float, output_tokens: float) -> float:
    """The most a request of at most ``input_tokens`` in and ``output_tokens`` out can
    cost at ``price``: each input token at the dearest input price (a budget's
    reservation must bound the real cost, whatever the cache does)."""
    top = max((price.input, *(c for c in _caches(price) if c is not None)))
    return (input_tokens * top + output_tokens * price.output) / PER


def dearest(prices: Iterable[Price]) -> Price:
    """A price at least every one of ``prices`` for every kind of token (what a
    reservation made before the deployment is known must use)."""
    top = FREE
    for p in prices:
        top = Price(
            input=max((top.input, p.input, *(c for c in _caches(p) if c is not None))),
            output=max(top.output, p.output),
        )
    return top


def _caches(price: Price) -> tuple[float | None, ...]:
    return (price.cached_input, price.cache_read, price.cache_write)


# An answer's price, for the client (a decimal string: ``format_usd``).
COST_HEADER = "x-llm-proxy-cost-usd"


def format_usd(amount: float) -> str:
    """A decimal string, no exponent (``0.0001375``)."""
    return f"{amount:.10f}".rstrip("0").rstrip(".") or "0"
