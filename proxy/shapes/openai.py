"""What OpenAI's API shapes share (pure): usage as OpenAI reports it, the error body
(``errors.error_body``, the contract's shape) and the stream's error event, the stream's
usage request (``stream_options.include_usage``).

Chat completions, completions and embeddings are each a module of their own
(``chat.py``, ``completions.py``, ``embeddings.py``) built on these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.costs import MAX_COUNT, Cost, NoCount, TokenUsage, estimate_cost, usage_count
from proxy.errors import error_body
from proxy.shapes import openai_fields
from proxy.shapes.base import AS_SENT, BodyRequest, ClientCredential, Prepared, StreamUsage
from proxy.shapes.credentials import BEARER
from proxy.shapes.ratelimit_headers import format_reset
from proxy.shapes.tokens import completion_tokens, prompt_tokens

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict, Kind
    from proxy.shapes.cache_prefixes import CachePrefixes
    from proxy.shapes.output_caps import OutputCaps

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
    None when it states neither count, or any of them is no count (``usage_count``).
    Tokens it counts under other names are counted too (``unknown_counts``)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    try:
        prompt, completion, cached = _counts(usage, given, made)
    except NoCount:
        return None
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    more_input, more_output = unknown_counts(usage, given, made, prompt + completion)
    return TokenUsage(
        input_tokens=prompt + more_input,
        output_tokens=completion + more_output,
        cached_input=min(cached or 0, prompt),  # part of the input, never more
    )


def _counts(usage: dict[str, Any], given: str, made: str) -> tuple[int | None, ...]:
    """The input, output and cached input counts (None: not stated); NoCount if one is
    no count."""
    details = usage.get(f"{given}_details")
    cached = usage_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return usage_count(usage.get(given)), usage_count(usage.get(made)), cached


def unknown_counts(usage: dict[str, Any], given: str, made: str, known: int) -> tuple[int, int]:
    """Tokens ``usage`` counts beyond its ``given`` and ``made`` counts (``known``
    together), as (input, output). With a ``total_tokens``, that total is what the
    upstream counted: the counts of other names are its breakdowns (a compatible
    server's ``prompt_cache_hit_tokens`` is part of its prompt), and only a total beyond
    ``known`` adds, as output (tokens no count names: generated, as reasoning is, on the
    safe side of a limit on output). Without one, each top-level ``*_tokens`` integer of
    another name adds, to the input if its name says ``prompt`` or ``input``, else to the
    output. Nested objects are breakdowns (``*_details``) and add nothing."""
    total = usage.get("total_tokens")
    if type(total) is int:
        return 0, min(max(total - known, 0), MAX_COUNT)
    given_more = made_more = 0
    for name, value in usage.items():
        if name in (given, made) or not name.endswith("_tokens") or type(value) is not int:
            continue
        count = min(max(value, 0), MAX_COUNT)
        if "prompt" in name or "input" in name:
            given_more += count
        else:
            made_more += count
    return given_more, made_more


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


class OpenAIShape(BodyRequest):
    """An OpenAI API shape: its fields checked as ``openai_fields`` does, its prompt
    estimated from ``messages``, ``prompt`` or ``input`` and its output up to its cap,
    usage as OpenAI reports it, errors in OpenAI's shape, a bearer key. A subclass names
    its paths (and may estimate otherwise)."""

    name: str = ""
    paths: tuple[str, ...] = ()
    credential: ClientCredential = BEARER
    stores_responses = False
    output_caps: OutputCaps | None = None

    # The functions themselves, not methods calling them: a call less per request each
    # (docs/performance.md, "seams bound once").
    check = staticmethod(openai_fields.check)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(prompt_tokens(body), completion_tokens(body, default_output))

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        return None  # OpenAI's cache is automatic, and its limits count what it reads

    prepare = staticmethod(stream_usage_request)
    usage = staticmethod(usage_of_body)

    def stream_usage(self) -> StreamUsage:
        return OpenAIStreamUsage()

    error_body = staticmethod(error_body)
    stream_error = staticmethod(stream_error)

    key_headers = staticmethod(key_headers)
