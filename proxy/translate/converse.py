"""Chat completions to AWS Bedrock's Converse API and back (pure): the request as
Converse takes it, its answer and its stream as the Messages API's (then to chat as a
Messages answer is: ``response.chat_from_message``, ``stream.ToChat``), its errors as
chat's.

A request: ``system`` and ``developer`` messages (before the conversation) are
``system`` text blocks, ``user`` and ``assistant`` turns' text ``content`` blocks, the
cap (``max_completion_tokens`` or ``max_tokens``, else the default) ``inferenceConfig``'s
``maxTokens`` beside ``temperature``, ``top_p`` (``topP``) and ``stop``
(``stopSequences``). Anything else (tools, images, ``n`` above 1, ``response_format``...)
is refused, naming the field (refusals.py). An answer: its text blocks, its
``stopReason`` (``guardrail_intervened`` and ``content_filtered`` as a refusal) and
``usage`` (``inputTokens``, ``outputTokens``, the cache counts) as a message's. A stream
(``messageStart``, ``contentBlockDelta``, ``messageStop``, ``metadata``: its usage, last)
as the Messages API's events, ``message_delta`` held until ``metadata`` has the usage.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.costs import TokenUsage
from proxy.shapes.converse import converse_usage, messages_usage
from proxy.translate.refusals import (
    Untranslatable,
    content_list,
    listing,
    mapping,
    only,
    refuse,
    text,
    wrong,
)
from proxy.translate.response import chat_error, chat_from_message, json_object
from proxy.translate.stream import MAX_EVENT, ToChat, to_chat

__all__ = [
    "ConverseToChat",
    "chat_from_converse",
    "converse_error",
    "to_converse",
    "to_converse_chat_stream",
]

UPSTREAM = "Bedrock Converse"
_NO_COUNTERPART = "Bedrock's Converse translation takes text turns only"
_HANDLED = frozenset(
    (
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "n",
        "stream",
        "stream_options",
    )
)
_STOP = {
    "end_turn": "end_turn",
    "stop_sequence": "stop_sequence",
    "max_tokens": "max_tokens",
    "tool_use": "tool_use",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
}


# --- the request ------------------------------------------------------------------------


def to_converse(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    """A chat request as Converse's (its ``model`` kept: the wire puts it in the URL);
    ``default_cap``: its ``maxTokens`` when the client set none."""
    only(body, _HANDLED, "", _NO_COUNTERPART, UPSTREAM)
    if body.get("n") not in (None, 1):
        refuse("n", "Converse answers with one choice", UPSTREAM)
    options = body.get("stream_options")
    if options is not None:
        only(mapping(options, "stream_options"), frozenset({"include_usage"}), "stream_options",
             _NO_COUNTERPART, UPSTREAM)  # fmt: skip
    system, turns = _turns(listing(body.get("messages"), "messages"))
    out: dict[str, Any] = {
        "model": body.get("model"),
        "messages": turns,
        "inferenceConfig": _inference(body, default_cap),
    }
    if system:
        out["system"] = system
    return out


def _turns(messages: list[Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    system: list[dict[str, str]] = []
    turns: list[dict[str, Any]] = []
    for i, given in enumerate(messages):
        where = f"messages[{i}]"
        message = mapping(given, where)
        only(message, frozenset({"role", "content", "name"}), where, _NO_COUNTERPART, UPSTREAM)
        role = message.get("role")
        blocks = [{"text": t} for t in _texts(message.get("content"), f"{where}.content")]
        if role in ("system", "developer"):
            if turns:
                refuse(where, "Converse takes system text before the conversation only", UPSTREAM)
            system += blocks
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": blocks})
        else:
            refuse(f"{where}.role", f"the role {role!r} ({_NO_COUNTERPART})", UPSTREAM)
    return system, turns


def _texts(content: Any, where: str) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts = []
    for j, part in enumerate(content_list(content, where)):
        part = mapping(part, f"{where}[{j}]")
        if part.get("type") != "text":
            refuse(f"{where}[{j}].type", f"a {part.get('type')!r} part", UPSTREAM)
        only(part, frozenset({"type", "text"}), f"{where}[{j}]", _NO_COUNTERPART, UPSTREAM)
        texts.append(text(part.get("text"), f"{where}[{j}].text"))
    return texts


def _inference(body: dict[str, Any], default_cap: int) -> dict[str, Any]:
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    config: dict[str, Any] = {"maxTokens": default_cap if cap is None else cap}
    for name, field in (("temperature", "temperature"), ("top_p", "topP")):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                wrong(name, "a number")
            config[field] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else listing(stop, "stop")
        config["stopSequences"] = [text(s, "stop") for s in stops]
    return config


# --- the answer -------------------------------------------------------------------------


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    """A Converse answer as a Messages message (its text blocks)."""
    output = payload.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        raise Untranslatable("its answer has no message")
    texts = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return {
        "id": None,
        "type": "message",
        "role": "assistant",
        "model": None,
        "content": [{"type": "text", "text": t} for t in texts],
        "stop_reason": _STOP.get(str(payload.get("stopReason")), "end_turn"),
        "usage": messages_usage(payload.get("usage")),
    }


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
        return b"".join(_sse(e) for e in self._messages(name.removeprefix(b"event: "), payload))

    def _messages(self, name: bytes, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """The Messages API's events for one Converse event."""
        if name == b"messageStart":
            usage = {"input_tokens": 0, "output_tokens": 0}
            message = {"id": None, "model": None, "role": "assistant", "usage": usage}
            return [{"type": "message_start", "message": message}]
        if name == b"contentBlockDelta":
            delta = payload.get("delta")
            said = delta.get("text") if isinstance(delta, dict) else None
            if not isinstance(said, str):
                return []  # (reasoning, tool input: never asked for)
            delta = {"type": "text_delta", "text": said}
            return [{"type": "content_block_delta", "index": 0, "delta": delta}]
        if name == b"messageStop":
            self._stop = _STOP.get(str(payload.get("stopReason")), "end_turn")
            return []
        if name == b"metadata":  # the last: the stop and the usage together
            delta = {"stop_reason": self._stop or "end_turn", "stop_sequence": None}
            usage = messages_usage(payload.get("usage"))
            return [
                {"type": "message_delta", "delta": delta, "usage": usage},
                {"type": "message_stop"},
            ]
        if name == b"error":  # Bedrock's exception, reframed as the Messages API's
            return [payload]
        return []  # contentBlockStart, contentBlockStop: nothing for a text answer


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def to_converse_chat_stream(client_body: dict[str, Any], created: int) -> ConverseToChat:
    """The translation of one ConverseStream for the chat request ``client_body``."""
    return ConverseToChat(to_chat(client_body, created))
