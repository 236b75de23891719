"""AWS Bedrock's Converse API, as an upstream speaks it (pure): no client is served it
(no paths); chat requests are translated to it (proxy/translate/converse.py). Its usage:
an answer's ``usage`` (``inputTokens``, ``outputTokens``, ``cacheReadInputTokens``,
``cacheWriteInputTokens``), a stream's in its last event, ``metadata``."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.costs import Cost, TokenUsage
from proxy.shapes.anthropic import AnthropicShape, usage_of
from proxy.shapes.base import StreamUsage

__all__ = ["CONVERSE", "converse_usage", "messages_usage"]


def messages_usage(usage: object) -> dict[str, Any]:
    """Converse's usage object as the Messages API's (its counts as they are)."""
    counts = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": counts.get("inputTokens"),
        "output_tokens": counts.get("outputTokens"),
        "cache_read_input_tokens": counts.get("cacheReadInputTokens"),
        "cache_creation_input_tokens": counts.get("cacheWriteInputTokens"),
    }


def converse_usage(usage: object) -> TokenUsage | None:
    """Converse's usage, read strictly as the Messages API's is (None: not counts)."""
    return usage_of({k: v for k, v in messages_usage(usage).items() if v is not None})


class ConverseStreamUsage:
    """A ConverseStream's usage: its ``metadata`` event's (the last)."""

    markers = (b'"usage"',)
    ends = (b"metadata",)

    def __init__(self) -> None:
        self.usage: TokenUsage | None = None

    def record(self, payload: dict[str, Any]) -> None:
        if "usage" in payload:
            self.usage = converse_usage(payload["usage"])

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return False  # Bedrock always reports it


class Converse(AnthropicShape):
    """Converse as a deployment's API: its usage; what concerns clients (paths, keys,
    errors) is never asked of it (the client's shape answers those)."""

    name = "converse"
    paths = ()

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        raise NotImplementedError("no client speaks Converse: its requests are translated")

    def usage(self, content: bytes) -> TokenUsage | None:
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            return None
        return converse_usage(payload.get("usage")) if isinstance(payload, dict) else None

    def stream_usage(self) -> StreamUsage:
        return ConverseStreamUsage()


CONVERSE = Converse()
