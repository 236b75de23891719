"""Anthropic's Messages API: ``POST /v1/messages``, plain and streamed (pure).

``max_tokens`` is required (as the API requires it): the estimate is the input (system,
messages, tools) plus it, corrected to the real usage once the answer says it. The
prefixes its ``cache_control`` breakpoints mark (``cache_prefixes``) tell what the
deployment may read from its prompt cache (Anthropic's input limit does not count it).
"""

from __future__ import annotations

from typing import Any

from proxy.costs import Cost, estimate_cost
from proxy.shapes.anthropic import AnthropicShape, check_fields
from proxy.shapes.cache_prefixes import CachePrefixes, prefixes
from proxy.shapes.output_caps import ANTHROPIC_CAPS
from proxy.shapes.tokens import messages_input_tokens

__all__ = ["MESSAGES"]


class Messages(AnthropicShape):
    name = "messages"
    paths = ("/v1/messages",)
    output_caps = ANTHROPIC_CAPS

    def check(self, body: dict[str, Any]) -> None:
        check_fields(body, max_tokens=True)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(messages_input_tokens(body), body["max_tokens"])  # checked

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        return prefixes(body, raw)


MESSAGES = Messages()
