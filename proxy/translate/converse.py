"""Chat completions to AWS Bedrock's Converse API and back (pure): the request as
Converse takes it (converse_request.py), its answer and its stream as the Messages API's
(then to chat as a Messages answer is: ``response.chat_from_message``, ``stream.ToChat``),
its errors as chat's. docs/translation.md is the table.

A request: ``system`` and ``developer`` messages (before the conversation) are
``system`` text blocks; ``user`` and ``assistant`` turns ``text`` blocks, a user's
base64 ``data:`` images ``image`` blocks (``format``, ``source.bytes`` in base64; a
remote URL, another format, bad base64 or more than 3.75 MB refused), an assistant's
``tool_calls`` ``toolUse`` blocks (``input``: the arguments, a JSON object); ``tool``
messages ``toolResult`` blocks of a user turn (consecutive turns of a role merged:
Converse takes alternating roles); ``tools`` ``toolConfig.tools[].toolSpec``
(``inputSchema.json``: the parameters), ``tool_choice`` ``auto`` / ``required`` / a
named function ``toolChoice`` ``auto`` / ``any`` / ``tool`` (``none`` refused: Converse
cannot forbid the tools it is given); the cap (``max_completion_tokens`` or
``max_tokens``, else the default) ``inferenceConfig``'s ``maxTokens`` beside
``temperature``, ``top_p`` (``topP``) and ``stop`` (``stopSequences``). Anything else
(``n`` above 1, ``response_format``...) is refused, naming the field (refusals.py).

An answer: its ``text`` blocks and ``toolUse`` blocks (as ``tool_use``: chat's
``tool_calls``, the input a JSON string), its ``stopReason`` (``tool_use`` is
``tool_calls``; ``guardrail_intervened`` and ``content_filtered`` a refusal) and
``usage`` (``inputTokens``, ``outputTokens``, the cache counts) as a message's. A stream
(``messageStart``, ``contentBlockStart`` of a ``toolUse``, ``contentBlockDelta`` of text
or of a ``toolUse``'s ``input`` piece, ``contentBlockStop``, ``messageStop``,
``metadata``: its usage, last) as the Messages API's events (``content_block_start`` of
a ``tool_use``, ``input_json_delta``), ``message_delta`` held until ``metadata`` has the
usage. A ``toolUse`` whose input is not a JSON object, or a delta of a block never
started, is ``Untranslatable``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.costs import TokenUsage
from proxy.shapes.converse import converse_usage, messages_usage
from proxy.translate.converse_request import UPSTREAM, to_converse
from proxy.translate.refusals import Untranslatable
from proxy.translate.response import chat_error, chat_from_message, json_object
from proxy.translate.stream import MAX_EVENT, ToChat, to_chat

__all__ = [
    "UPSTREAM",
    "ConverseToChat",
    "chat_from_converse",
    "converse_error",
    "to_converse",
    "to_converse_chat_stream",
]

_STOP = {
    "end_turn": "end_turn",
    "stop_sequence": "stop_sequence",
    "max_tokens": "max_tokens",
    "tool_use": "tool_use",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
}


# --- the answer -------------------------------------------------------------------------


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    """A Converse answer as a Messages message (its text and tool_use blocks)."""
    output = payload.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        raise Untranslatable("its answer has no message")
    content = [_block(block) for block in blocks if isinstance(block, dict)]
    return {
        "id": None,
        "type": "message",
        "role": "assistant",
        "model": None,
        "content": [block for block in content if block is not None],
        "stop_reason": _STOP.get(str(payload.get("stopReason")), "end_turn"),
        "usage": messages_usage(payload.get("usage")),
    }


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    """A content block as the Messages API's (None: a kind never asked for, reasoning)."""
    if isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if "toolUse" not in block:
        return None
    use = block["toolUse"]
    use = use if isinstance(use, dict) else {}
    ident, name, given = use.get("toolUseId"), use.get("name"), use.get("input")
    if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(given, dict):
        raise Untranslatable("a toolUse without its id, its name or an input object")
    return {"type": "tool_use", "id": ident, "name": name, "input": given}


def chat_from_converse(content: bytes, created: int) -> tuple[bytes, TokenUsage | None]:
    """A Converse 200 as a chat completion, and the usage Bedrock reported."""
    payload = json_object(content)
    answer, _ = chat_from_message(orjson.dumps(_message(payload)), created)
    return answer, converse_usage(payload.get("usage"))


def converse_error(status: int, content: bytes) -> bytes:
    """Bedrock's error body (``{"message"}``) in chat's shape."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        payload = None
    said = payload.get("message") if isinstance(payload, dict) else None
    error = {"message": said if isinstance(said, str) else content.decode(errors="replace")}
    return chat_error(status, orjson.dumps({"type": "error", "error": error}))


# --- the stream ---------------------------------------------------------------------------


class ConverseToChat:
    """A ConverseStream's events (reframed as server-sent events: ``event: <its type>``,
    ``data: <its JSON>``) as chat chunks, through the Messages API's events."""

    def __init__(self, chat: ToChat) -> None:
        self._chat = chat
        self._held = b""
        self._stop: str | None = None
        self._inputs: dict[int, list[str]] = {}  # an open toolUse block's input so far
        self._input_bytes = 0  # held in _inputs, bounded as an event is

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > MAX_EVENT:
                raise Untranslatable("an event over the bound")
            self._held = data
            return b""
        self._held = data[end + 2 :]
        events = data[: end + 2].split(b"\n\n")
        return self._chat.feed(b"".join(self._event(e) for e in events if e))

    def flush(self) -> bytes:
        rest, self._held = self._held, b""
        return self._chat.feed(self._event(rest) if rest.strip() else b"") + self._chat.flush()

    def _event(self, event: bytes) -> bytes:
        name, _, data = event.partition(b"\ndata: ")
        payload = json_object(data, "a stream event")
        handler = _HANDLERS.get(name.removeprefix(b"event: "))
        return b"" if handler is None else b"".join(_sse(e) for e in handler(self, payload))

    def _start(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        usage = {"input_tokens": 0, "output_tokens": 0}
        message = {"id": None, "model": None, "role": "assistant", "usage": usage}
        return [{"type": "message_start", "message": message}]

    def _block_start(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        start = payload.get("start")
        use = start.get("toolUse") if isinstance(start, dict) else None
        if use is None:
            return []  # (a start of another kind: never asked for)
        index = _index(payload)
        ident = use.get("toolUseId") if isinstance(use, dict) else None
        name = use.get("name") if isinstance(use, dict) else None
        if not isinstance(ident, str) or not isinstance(name, str) or index in self._inputs:
            raise Untranslatable("a toolUse start without its id or name, or started twice")
        self._inputs[index] = []
        block = {"type": "tool_use", "id": ident, "name": name, "input": {}}
        return [{"type": "content_block_start", "index": index, "content_block": block}]

    def _delta(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        delta = payload.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if isinstance(delta.get("text"), str):
            said = {"type": "text_delta", "text": delta["text"]}
            return [{"type": "content_block_delta", "index": _index(payload), "delta": said}]
        if "toolUse" not in delta:
            return []  # (reasoning: never asked for)
        use, index = delta["toolUse"], _index(payload)
        piece = use.get("input") if isinstance(use, dict) else None
        if index not in self._inputs or not isinstance(piece, str):
            raise Untranslatable("a toolUse delta of a block never started, or not a string")
        self._input_bytes += len(piece)
        if self._input_bytes > MAX_EVENT:
            raise Untranslatable("a tool's input over the bound")
        self._inputs[index].append(piece)
        said = {"type": "input_json_delta", "partial_json": piece}
        return [{"type": "content_block_delta", "index": index, "delta": said}]

    def _block_stop(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        pieces = self._inputs.pop(_index(payload), None)
        if pieces is not None:
            _check_input("".join(pieces))
        return []

    def _message_stop(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        for pieces in self._inputs.values():  # blocks never stopped: their input whole
            _check_input("".join(pieces))
        self._inputs.clear()
        self._stop = _STOP.get(str(payload.get("stopReason")), "end_turn")
        return []

    def _metadata(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        # The last event: the stop and the usage together.
        delta = {"stop_reason": self._stop or "end_turn", "stop_sequence": None}
        usage = messages_usage(payload.get("usage"))
        return [
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def _error(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        return [payload]  # Bedrock's exception, reframed as the Messages API's already


_HANDLERS: dict[bytes, Callable[[ConverseToChat, dict[str, Any]], list[dict[str, Any]]]] = {
    b"messageStart": ConverseToChat._start,
    b"contentBlockStart": ConverseToChat._block_start,
    b"contentBlockDelta": ConverseToChat._delta,
    b"contentBlockStop": ConverseToChat._block_stop,
    b"messageStop": ConverseToChat._message_stop,
    b"metadata": ConverseToChat._metadata,
    b"error": ConverseToChat._error,
}


def _index(payload: dict[str, Any]) -> int:
    """An event's ``contentBlockIndex`` (0 when it names none: a text-only stream)."""
    index = payload.get("contentBlockIndex", 0)
    if type(index) is not int or index < 0:
        raise Untranslatable("a content block index that is not a count")
    return index


def _check_input(given: str) -> None:
    """A streamed toolUse's whole input: a JSON object (or nothing: no arguments)."""
    if not given.strip():
        return
    try:
        parsed = orjson.loads(given)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise Untranslatable("a toolUse whose input is not a JSON object")


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def to_converse_chat_stream(client_body: dict[str, Any], created: int) -> ConverseToChat:
    """The translation of one ConverseStream for the chat request ``client_body``."""
    return ConverseToChat(to_chat(client_body, created))
