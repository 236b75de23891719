"""OpenAI's Responses API: ``POST /v1/responses``, plain and streamed (pure).

What differs from chat: the input is ``input`` (a string or a list of items) beside
``instructions`` and ``tools``, the output cap is ``max_output_tokens``; usage counts
``input_tokens`` / ``output_tokens`` (``input_tokens_details.cached_tokens`` part of the
input); a stream is semantic events (``event: response.output_text.delta`` ...) ending in
``response.completed``, ``response.incomplete`` or ``response.failed``, whose
``response.usage`` is the usage, with no ``[DONE]`` and nothing to ask for
(``stream_options`` is chat's). A response is stored upstream under its ``id`` (the plain
answer's, a stream's ``response.created`` event's): ``created_id`` and ``FirstEvent`` read
it, for the follow-ups that must reach the same account (``proxy/pipeline/affinity.py``).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.costs import Cost, TokenUsage, count, estimate_cost
from proxy.errors import InvalidRequest
from proxy.shapes.base import AS_SENT, Prepared, StreamUsage
from proxy.shapes.openai import OpenAIShape, token_usage
from proxy.shapes.output_caps import RESPONSES_CAPS
from proxy.shapes.tokens import text_tokens

__all__ = [
    "RESPONSES",
    "STORED_RESPONSES",
    "FirstEvent",
    "ResponsesStreamUsage",
    "created_id",
    "final_usage",
    "usage_of_response",
]

_PER_ITEM = 4  # role and framing tokens per input item, as chat's per message
_ITEM_TEXT = ("content", "output", "arguments", "summary", "text")
_CHARS_PER_TOKEN = 4
# The events that end a stream; their ``response`` carries the usage.
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# The statuses of a response that is over: its usage is what it cost.
OVER = ("completed", "incomplete", "failed", "cancelled")
_MARKERS = tuple(f'"{name}"'.encode() for name in TERMINAL)
MAX_FIRST_EVENT = 64 * 1024  # bytes of a stream's first event looked at for its id


def usage_of_response(response: object) -> TokenUsage | None:
    """The ``usage`` of a response object (None: it states no counts, as a response
    still queued or in progress does)."""
    return token_usage(response, "input_tokens", "output_tokens")


def created_id(content: bytes) -> str | None:
    """The id of the response a plain answer created (None: none there)."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return _response_id(payload)


def final_usage(content: bytes, response_id: str) -> TokenUsage | None:
    """The usage of response ``response_id`` as an answer describes it, once it is over
    (``GET /v1/responses/{id}``, ``.../cancel``); None while it runs, or without usage."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if _response_id(payload) != response_id or payload.get("status") not in OVER:
        return None
    return usage_of_response(payload)


def _response_id(response: object) -> str | None:
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= 256 else None


class FirstEvent:
    """Reads a stream's first event as its bytes pass (at most ``MAX_FIRST_EVENT``):
    ``response.created``, whose ``response.id`` is the response's id."""

    def __init__(self) -> None:
        self._held = b""
        self.done = False

    def feed(self, chunk: bytes) -> str | None:
        """The id, once the first event is whole (then ``done``); None before or
        without one."""
        if self.done:
            return None
        data = self._held + chunk
        end = data.find(b"\n\n")
        if end < 0:
            if len(data) > MAX_FIRST_EVENT:
                self.done, self._held = True, b""
            else:
                self._held = data
            return None
        self.done, self._held = True, b""
        for line in data[:end].split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    payload = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    return None
                if isinstance(payload, dict) and payload.get("type") == "response.created":
                    return _response_id(payload.get("response"))
        return None


class ResponsesStreamUsage:
    """A stream's usage: its final event's ``response.usage``. (An event too long for
    the tap to hold comes as ``{"usage": ...}`` alone: sse.UsageTap's tail.)"""

    markers = _MARKERS
    ends = _MARKERS

    def __init__(self) -> None:
        self.usage: TokenUsage | None = None

    def record(self, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind in TERMINAL:
            self.usage = usage_of_response(payload.get("response")) or self.usage
        elif kind is None:
            self.usage = usage_of_response(payload) or self.usage

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return False  # the proxy asks the stream for nothing


class Responses(OpenAIShape):
    name = "responses"
    stores_responses = True  # follow-ups continue them (follow_ups.py)
    paths: tuple[str, ...] = ("/v1/responses",)
    output_caps = RESPONSES_CAPS

    def check(self, body: dict[str, Any]) -> None:
        _check(body)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        output = count(body.get("max_output_tokens")) or default_output
        return estimate_cost(input_tokens(body), output)

    def prepare(self, body: dict[str, Any], stream: bool) -> Prepared:
        return AS_SENT

    def usage(self, content: bytes) -> TokenUsage | None:
        try:
            return usage_of_response(orjson.loads(content))
        except orjson.JSONDecodeError:
            return None

    def stream_usage(self) -> StreamUsage:
        return ResponsesStreamUsage()

    def stream_error(self, message: str) -> bytes:
        return stream_error(message)


def stream_error(message: str) -> bytes:
    """The Responses API's ``error`` event; its ``error`` object is what the OpenAI SDK
    raises as an APIError."""
    error = {"message": message, "type": "api_error", "param": None, "code": "stream_error"}
    payload = orjson.dumps({**error, "type": "error", "error": error})
    return b"event: error\ndata: " + payload + b"\n\n"


class StoredResponses(Responses):
    """A stored response's routes (``GET`` / ``DELETE /v1/responses/{id}``, ``/cancel``,
    ``/input_items``): served where ``responses`` is, no model and no tokens. The answer
    describes a response made earlier, whose tokens were counted then: it uses none."""

    paths: tuple[str, ...] = ()

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(0, 0)

    def usage(self, content: bytes) -> TokenUsage | None:
        return TokenUsage()

    def stream_usage(self) -> StreamUsage:
        return _Replayed()


class _Replayed:
    """A stored response's events replayed (``GET ...?stream=true``): its final event
    repeats the usage counted when it was made; nothing is read, none is charged."""

    markers: tuple[bytes, ...] = ()
    ends = _MARKERS
    usage = TokenUsage()

    def record(self, payload: dict[str, Any]) -> None:
        return None

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return False


RESPONSES = Responses()
STORED_RESPONSES = StoredResponses()


def input_tokens(body: dict[str, Any]) -> int:
    """Estimated input tokens: ``input`` (a string or items), ``instructions`` and the
    ``tools`` definitions (their JSON's size)."""
    total = 0
    given = body.get("input")
    if isinstance(given, list):
        for item in given:
            total += _item_tokens(item)
    elif given is not None:
        total += text_tokens(given)
    instructions = body.get("instructions")
    if instructions is not None:
        total += _PER_ITEM + text_tokens(instructions)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        try:
            total += len(orjson.dumps(tools)) // _CHARS_PER_TOKEN
        except orjson.JSONEncodeError:  # nested deeper than orjson goes: walk it
            total += text_tokens(tools)
    return total


def _item_tokens(item: object) -> int:
    """A message (``content``), a tool call (``arguments``) or its result (``output``),
    a reasoning summary; anything else as content parts are counted."""
    if not isinstance(item, dict):
        return text_tokens(item)
    fields = [item[name] for name in _ITEM_TEXT if name in item]
    if not fields:
        return _PER_ITEM + text_tokens(item)
    return _PER_ITEM + sum(text_tokens(value) for value in fields)


def _check(body: dict[str, Any]) -> None:
    """The fields the proxy reads, in the shapes it reads them (400 naming the param)."""
    _check_flags(body)
    _check_input(body.get("input"))
    cap = body.get("max_output_tokens")
    if cap is not None and count(cap) is None:
        _invalid("max_output_tokens", "a non-negative integer")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str | list):
        _invalid("instructions", "a string")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        _invalid("tools", "an array of tool objects")
    _check_previous_id(body.get("previous_response_id"))


def _check_flags(body: dict[str, Any]) -> None:
    """``stream``, ``store`` and ``background`` are read as ``is True``/``is False``: any
    other value is refused, not quietly taken for false."""
    for name in ("stream", "store", "background"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            _invalid(name, "a boolean")


def _check_input(given: object) -> None:
    """``input`` is a string or a list of item objects, whose fields the estimate counts."""
    if isinstance(given, list):
        for i, item in enumerate(given):
            if not isinstance(item, dict):
                _invalid(f"input[{i}]", "an object")
    elif given is not None and not isinstance(given, str):
        _invalid("input", "a string or an array of input items")


def _check_previous_id(previous: object) -> None:
    """A ``previous_response_id`` is looked up to pin the follow-up to the account that
    stores it (follow_ups.py): a non-empty string."""
    if previous is not None and (not isinstance(previous, str) or not previous):
        _invalid("previous_response_id", "a response id (a string)")


def _invalid(param: str, shape: str) -> None:
    raise InvalidRequest(f"'{param}' must be {shape}.", code="invalid_type", param=param)
