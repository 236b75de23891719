"""Anthropic's token counting: ``POST /v1/messages/count_tokens`` (pure).

Anthropic limits it apart from messages (its own requests per minute; it uses no input
or output tokens): here it costs one request and no tokens, in the key's request windows
and the deployment's (docs/limiter.md). Its answer, ``{"input_tokens": N}``, is a count,
not usage: nothing is corrected after it.
"""

from __future__ import annotations

from typing import Any

from proxy.costs import Cost, TokenUsage, estimate_cost
from proxy.shapes.anthropic import AnthropicShape

__all__ = ["COUNT_TOKENS"]

_NOTHING = TokenUsage()


class CountTokens(AnthropicShape):
    name = "messages/count_tokens"
    paths = ("/v1/messages/count_tokens",)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(0.0)

    def usage(self, content: bytes) -> TokenUsage | None:
        return _NOTHING  # used no tokens, as estimated


COUNT_TOKENS = CountTokens()
