"""What OpenAI's API shapes share (pure): usage as OpenAI reports it, the error body
(``errors.error_body``, the contract's shape) and the stream's error event, the stream's
usage request (``stream_options.include_usage``).

Chat completions, completions and embeddings are each a module of their own
(``chat.py``, ``completions.py``, ``embeddings.py``) built on these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.costs import Cost, NoCount, TokenUsage, estimate_cost, usage_count
from proxy.errors import error_body
from proxy.ratelimit_headers import format_reset
from proxy.shapes import openai_fields
from proxy.shapes.base import AS_SENT, ClientCredential, Prepared, StreamUsage
from proxy.shapes.credentials import BEARER
from proxy.shapes.tokens import completion_tokens, prompt_tokens

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict, Kind

__all__ = [
    "OpenAIShape",
    "OpenAIStreamUsage",
    "key_headers",
    "stream_error",
    "stream_usage_request",
    "token_usage",
    "usage_of_body",
    "usage_of_payload",
]

_USAGE_MARKERS = (b'"usage":{', b'"usage": {')


def usage_of_payload(payload: object) -> TokenUsage | None:
    """The ``usage`` of an OpenAI object: ``prompt_tokens`` (its
    ``prompt_tokens_details.cached_tokens`` part of them: ``cached_input``) and
    ``completion_tokens``; None when it states neither count."""
    return token_usage(payload, "prompt_tokens", "completion_tokens")


def token_usage(payload: object, given: str, made: str) -> TokenUsage | None:
    """The ``usage`` of an OpenAI object whose input and output counts are named
    ``given`` and ``made`` (chat's ``prompt_tokens``, the Responses API's
    ``input_tokens``...), ``{given}_details.cached_tokens`` the cached part of the input;
    None when it states neither count, or any of them is no count (``usage_count``)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get(f"{given}_details")
    try:
        prompt, completion = usage_count(usage.get(given)), usage_count(usage.get(made))
        cached = usage_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    except NoCount:
        return None
    if prompt is None and completion is None:
        return None
    return TokenUsage(
        input_tokens=prompt or 0,
        output_tokens=completion or 0,
        cached_input=min(cached or 0, prompt or 0),  # part of the input, never more
    )


def usage_of_body(content: bytes) -> TokenUsage | None:
    """The usage of a buffered JSON answer (None where it has none)."""
    try:
        return usage_of_payload(orjson.loads(content))
    except orjson.JSONDecodeError:
        return None


class OpenAIStreamUsage:
    """A stream's usage: the last event carrying a ``usage`` object (the proxy's own
    usage-only event, ``choices: []``, when it asked for one)."""

    markers = _USAGE_MARKERS
    ends = (b"data: [DONE]",)

    def __init__(self) -> None:
        self.usage: TokenUsage | None = None

    def record(self, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("usage"), dict):
            self.usage = usage_of_payload(payload)

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return payload.get("choices") == []


def stream_usage_request(body: dict[str, Any], stream: bool) -> Prepared:
    """A stream's usage, asked for (``stream_options.include_usage``) when the client did
    not: the proxy needs it to settle the token budgets, the client does not see it."""
    options = body.get("stream_options")
    if not stream or (isinstance(options, dict) and options.get("include_usage") is True):
        return AS_SENT
    return Prepared({"stream_options": {**(options or {}), "include_usage": True}}, True)


def stream_error(message: str) -> bytes:
    """An SSE error event the OpenAI SDK raises as an APIError."""
    payload = orjson.dumps(
        {"error": {"message": message, "type": "api_error", "param": None, "code": "stream_error"}}
    )
    return b"data: " + payload + b"\n\n"


# Each kind's header names, made once (they go on every answer of a limited key).
_KEY_HEADERS: tuple[tuple[Kind, str, str, str], ...] = tuple(
    (
        kind,
        f"x-ratelimit-limit-{kind}",
        f"x-ratelimit-remaining-{kind}",
        f"x-ratelimit-reset-{kind}",
    )
    for kind in ("requests", "tokens")
)


def key_headers(verdict: KeyVerdict, now: float) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers; of several windows of a kind, the one with the
    least left."""
    headers: dict[str, str] = {}
    for kind, limit, remaining, reset in _KEY_HEADERS:
        usage = verdict.tightest(kind)
        if usage is not None:
            headers[limit] = str(int(usage.limit))
            headers[remaining] = str(max(int(usage.remaining), 0))
            headers[reset] = format_reset(usage.reset)
    return headers


class OpenAIShape:
    """An OpenAI API shape: its fields checked as ``openai_fields`` does, its prompt
    estimated from ``messages``, ``prompt`` or ``input`` and its output up to its cap,
    usage as OpenAI reports it, errors in OpenAI's shape, a bearer key. A subclass names
    its paths (and may estimate otherwise)."""

    name: str = ""
    paths: tuple[str, ...] = ()
    credential: ClientCredential = BEARER

    # The functions themselves, not methods calling them: a call less per request each
    # (docs/performance.md, "seams bound once").
    check = staticmethod(openai_fields.check)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(prompt_tokens(body), completion_tokens(body, default_output))

    prepare = staticmethod(stream_usage_request)
    usage = staticmethod(usage_of_body)

    def stream_usage(self) -> StreamUsage:
        return OpenAIStreamUsage()

    error_body = staticmethod(error_body)
    stream_error = staticmethod(stream_error)

    key_headers = staticmethod(key_headers)
