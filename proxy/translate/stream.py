"""Streams translated event by event (pure): the upstream's SSE bytes in, the client's API's
SSE bytes out, as they come.

A Messages stream for a chat client (``ToChat``): ``message_start`` is the first chunk
(``role: assistant``); a text block's deltas are ``content`` deltas; a ``tool_use``
block's start is a ``tool_calls`` delta with its id and name, its ``input_json_delta``
pieces the call's ``arguments`` pieces (the call's index counts the tool blocks);
``message_delta`` is the chunk with ``finish_reason``; ``message_stop`` is the usage chunk
(``choices: []``, only when the client asked: ``stream_options.include_usage``) and
``data: [DONE]``; ``ping`` is nothing; an ``error`` event an OpenAI error chunk.

A chat stream for a Messages client (``ToMessages``): the first chunk is
``message_start`` (usage not known yet: 0); ``content`` deltas are a text block's
(``content_block_start``, then ``text_delta``s), a ``tool_calls`` delta with an id opens
a ``tool_use`` block, its ``arguments`` pieces are ``input_json_delta``s; a block ends
(``content_block_stop``) when another begins or with ``finish_reason``; ``[DONE]`` is
``message_delta`` (the stop reason, and the usage the chat stream's usage chunk told,
cumulative as Anthropic's are) and ``message_stop``; an error chunk an ``error`` event.

An event is translated once whole (held across chunks, at most ``MAX_EVENT`` bytes: a
longer one is ``Untranslatable``).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from proxy.translate.refusals import Untranslatable
from proxy.translate.response import chat_usage, finish_reason, messages_usage, stop_reason

__all__ = ["MAX_EVENT", "EventStream", "ToChat", "ToMessages", "to_chat", "to_messages"]

MAX_EVENT = 16 << 20  # bytes of one upstream event held until it ends
_DONE = b"data: [DONE]\n\n"


class EventStream(Protocol):
    """One stream's translation: ``feed`` the upstream's bytes, the client's come out."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes:
        """What is left once the upstream's stream ended."""
        ...


class _Events:
    """Whole SSE events out of chunks cut anywhere."""

    def __init__(self) -> None:
        self._held = b""

    def split(self, chunk: bytes) -> list[bytes]:
        data = self._held + chunk if self._held else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > MAX_EVENT:
                raise Untranslatable("an event over the bound")
            self._held = data
            return []
        self._held = data[end + 2 :]
        return [event for event in data[:end].split(b"\n\n") if event.strip()]

    def rest(self) -> list[bytes]:
        rest, self._held = self._held, b""
        return [rest] if rest.strip() else []


def _data(event: bytes) -> bytes:
    """An event's data (its ``data:`` lines joined)."""
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines)


def _payload(data: bytes) -> dict[str, Any] | None:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --- a Messages stream for a chat client ------------------------------------------------


class ToChat:
    """Anthropic's events as chat completion chunks."""

    def __init__(self, include_usage: bool, created: int) -> None:
        self._events = _Events()
        self._include_usage = include_usage
        self._created = created
        self._id: object = None
        self._model: object = None
        self._usage: dict[str, Any] = {}
        self._calls: dict[object, int] = {}  # a tool_use block's index -> its call's

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._event(event) for event in self._events.split(chunk))

    def flush(self) -> bytes:
        return b"".join(self._event(event) for event in self._events.rest())

    def _event(self, event: bytes) -> bytes:
        payload = _payload(_data(event))
        if payload is None:
            return b""
        handler = _TO_CHAT.get(str(payload.get("type")))  # (ping, unknown events: nothing)
        return b"" if handler is None else handler(self, payload)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        if self._include_usage:
            chunk["usage"] = None
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _start(self, payload: dict[str, Any]) -> bytes:
        message = _dict(payload.get("message"))
        self._id, self._model = message.get("id"), message.get("model")
        self._usage.update(_dict(message.get("usage")))
        return self._chunk({"role": "assistant", "content": ""})

    def _block(self, payload: dict[str, Any]) -> bytes:
        block = _dict(payload.get("content_block"))
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            return self._chunk({"content": block["text"]})
        if kind != "tool_use":  # (thinking, server tools: only when asked for)
            return b""
        index = self._calls[payload.get("index")] = len(self._calls)
        given = block.get("input")  # {} as Anthropic starts it; whole, if an upstream sends it
        arguments = orjson.dumps(given).decode() if isinstance(given, dict) and given else ""
        function = {"name": block.get("name"), "arguments": arguments}
        call = {"index": index, "id": block.get("id"), "type": "function", "function": function}
        return self._chunk({"tool_calls": [call]})

    def _delta(self, payload: dict[str, Any]) -> bytes:
        delta = _dict(payload.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            return self._chunk({"content": delta.get("text", "")})
        index = self._calls.get(payload.get("index"))
        if kind != "input_json_delta" or index is None:
            return b""
        piece = {"index": index, "function": {"arguments": delta.get("partial_json", "")}}
        return self._chunk({"tool_calls": [piece]})

    def _stopping(self, payload: dict[str, Any]) -> bytes:
        self._usage.update(_dict(payload.get("usage")))  # cumulative counts: the latest
        stop = _dict(payload.get("delta")).get("stop_reason")
        return self._chunk({}, finish_reason(stop) or "stop")

    def _stop(self, payload: dict[str, Any]) -> bytes:
        if not self._include_usage:
            return _DONE
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [],
            "usage": chat_usage(self._usage),
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n" + _DONE

    def _error(self, payload: dict[str, Any]) -> bytes:
        error = _dict(payload.get("error"))
        shaped = {
            "message": error.get("message", ""),
            "type": error.get("type", "api_error"),
            "param": None,
            "code": None,
        }
        return b"data: " + orjson.dumps({"error": shaped}) + b"\n\n"


_TO_CHAT = {
    "message_start": ToChat._start,
    "content_block_start": ToChat._block,
    "content_block_delta": ToChat._delta,
    "message_delta": ToChat._stopping,
    "message_stop": ToChat._stop,
    "error": ToChat._error,
}


def to_chat(client_body: dict[str, Any], created: int) -> ToChat:
    """The translation of one Messages stream for the chat request ``client_body``."""
    options = client_body.get("stream_options")
    include = isinstance(options, dict) and options.get("include_usage") is True
    return ToChat(include, created)


# --- a chat stream for a Messages client ------------------------------------------------


def _event_bytes(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ToMessages:
    """Chat completion chunks as Anthropic's events."""

    def __init__(self) -> None:
        self._events = _Events()
        self._started = False
        self._done = False
        self._id: object = None
        self._model: object = None
        self._blocks = 0  # blocks opened so far
        self._open: object = None  # the open block: "text", a tool call's index, or None
        self._calls: dict[object, int] = {}  # a tool call's index -> its block's
        self._stop: str | None = None
        self._refused = False  # a refusal delta came: the stop reason is refusal
        self._usage: object = None

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._event(event) for event in self._events.split(chunk))

    def flush(self) -> bytes:
        out = b"".join(self._event(event) for event in self._events.rest())
        if self._stop is not None and not self._done:  # ended without [DONE]
            out += self._end()
        return out

    def _event(self, event: bytes) -> bytes:
        data = _data(event)
        if data == b"[DONE]":
            return self._end()
        payload = _payload(data)
        if payload is None:
            return b""
        if "error" in payload and "choices" not in payload:
            return self._error(_dict(payload.get("error")))
        out = self._begin(payload)
        if isinstance(payload.get("usage"), dict):
            self._usage = payload["usage"]
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice)
        return out

    def _begin(self, payload: dict[str, Any]) -> bytes:
        if self._started:
            return b""
        self._started = True
        self._id, self._model = payload.get("id"), payload.get("model")
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _event_bytes("message_start", {"type": "message_start", "message": message})

    def _choice(self, choice: dict[str, Any]) -> bytes:
        delta = _dict(choice.get("delta"))
        out = self._text(delta.get("content"))
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            out += self._text(refusal)
            self._refused = True
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                out += self._call(call)
        finish = choice.get("finish_reason")
        if finish is not None:
            self._stop = "refusal" if self._refused else stop_reason(finish)
            out += self._close()
        return out

    def _open_block(self, key: object, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._open, index = key, self._blocks
        self._blocks += 1
        start = {"type": "content_block_start", "index": index, "content_block": block}
        return out + _event_bytes("content_block_start", start)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        stop = {"type": "content_block_stop", "index": self._blocks - 1}
        return _event_bytes("content_block_stop", stop)

    def _text(self, text: object) -> bytes:
        if not isinstance(text, str) or not text:
            return b""
        out = (
            b"" if self._open == "text" else self._open_block("text", {"type": "text", "text": ""})
        )
        delta = {"type": "text_delta", "text": text}
        payload = {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}
        return out + _event_bytes("content_block_delta", payload)

    def _call(self, call: dict[str, Any]) -> bytes:
        key = ("call", call.get("index", 0))
        function = _dict(call.get("function"))
        out = b""
        if key not in self._calls:
            block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name")}
            out = self._open_block(key, {**block, "input": {}})
            self._calls[key] = self._blocks - 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            payload = {"type": "content_block_delta", "index": self._calls[key], "delta": delta}
            out += _event_bytes("content_block_delta", payload)
        return out

    def _end(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        out = self._begin({}) + self._close()
        delta = {"stop_reason": self._stop or "end_turn", "stop_sequence": None}
        usage = messages_usage(self._usage)
        out += _event_bytes(
            "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
        )
        return out + _event_bytes("message_stop", {"type": "message_stop"})

    def _error(self, error: dict[str, Any]) -> bytes:
        message = error.get("message")
        shaped = {"type": "api_error", "message": message if isinstance(message, str) else ""}
        return _event_bytes("error", {"type": "error", "error": shaped})


def to_messages(client_body: dict[str, Any], created: int) -> ToMessages:
    """The translation of one chat stream for a Messages client."""
    return ToMessages()
