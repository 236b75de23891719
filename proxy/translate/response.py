"""Answers translated back to the client's API (pure): a buffered 200, an error body, and
what streams share with them: stop reasons and usage.

Stop reasons: ``end_turn``, ``stop_sequence`` and ``pause_turn`` are chat's ``stop``,
``max_tokens`` and ``model_context_window_exceeded`` its ``length``, ``tool_use`` its
``tool_calls``, ``refusal`` its ``content_filter``; back, ``stop`` is ``end_turn`` (chat
does not say whether a stop sequence ended it), ``length`` ``max_tokens``,
``tool_calls`` (and the deprecated ``function_call``) ``tool_use``, ``content_filter``
``refusal``.

Usage: chat's ``prompt_tokens`` is every input token, the Messages API's
``input_tokens`` the uncached ones, beside ``cache_read_input_tokens`` and
``cache_creation_input_tokens``: prompt = input + cache reads + cache writes, and chat's
``prompt_tokens_details.cached_tokens`` is the cache reads (chat reports no writes: 0).
The settlement reads the upstream's own usage (the deployment's units), never these.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.costs import TokenUsage
from proxy.shapes.anthropic import error_type, usage_of
from proxy.shapes.openai import usage_of_payload
from proxy.translate.refusals import Untranslatable

__all__ = [
    "chat_error",
    "chat_from_message",
    "chat_usage",
    "finish_reason",
    "json_object",
    "message_from_chat",
    "messages_error",
    "messages_usage",
    "stop_reason",
]

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def finish_reason(stop: object) -> str | None:
    """Chat's ``finish_reason`` for a Messages ``stop_reason`` (None: not yet)."""
    if not isinstance(stop, str):
        return None
    return _FINISH.get(stop, "stop")


def stop_reason(finish: object) -> str | None:
    """The Messages ``stop_reason`` for a chat ``finish_reason`` (None: not yet)."""
    if not isinstance(finish, str):
        return None
    return _STOP.get(finish, "end_turn")


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def chat_usage(usage: object) -> dict[str, Any]:
    """A Messages usage object as chat's."""
    counts = usage if isinstance(usage, dict) else {}
    read = _count(counts.get("cache_read_input_tokens"))
    prompt = (
        _count(counts.get("input_tokens"))
        + read
        + _count(counts.get("cache_creation_input_tokens"))
    )
    output = _count(counts.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": read},
    }


def messages_usage(usage: object) -> dict[str, Any]:
    """A chat usage object as the Messages API's."""
    counts = usage if isinstance(usage, dict) else {}
    prompt = _count(counts.get("prompt_tokens"))
    details = counts.get("prompt_tokens_details")
    cached = min(_count(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": _count(counts.get("completion_tokens")),
    }


def json_object(content: bytes, what: str = "its answer") -> dict[str, Any]:
    """An upstream's JSON object (``what`` it is, for the ``Untranslatable`` raised)."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise Untranslatable(f"{what} is not JSON") from None
    if not isinstance(payload, dict):
        raise Untranslatable(f"{what} is not a JSON object")
    return payload


# --- a Messages answer for a chat client ------------------------------------------------


def chat_from_message(content: bytes, created: int) -> tuple[bytes, TokenUsage | None]:
    """A Messages 200 as a chat completion (``created``: epoch seconds), and the usage
    the upstream reported (its own units: settlement's)."""
    payload = json_object(content)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    blocks = payload.get("content")
    for block in blocks if isinstance(blocks, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        # (thinking and server tools' blocks come only when asked for: never translated)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason(payload.get("stop_reason")),
    }
    answer = {
        "id": payload.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": payload.get("model"),
        "choices": [choice],
        "usage": chat_usage(payload.get("usage")),
    }
    return orjson.dumps(answer), usage_of(payload.get("usage"))


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    given = block.get("input")
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {
            "name": block.get("name"),
            "arguments": orjson.dumps(given if isinstance(given, dict) else {}).decode(),
        },
    }


# --- a chat answer for a Messages client ------------------------------------------------


def message_from_chat(content: bytes, created: int) -> tuple[bytes, TokenUsage | None]:
    """A chat completion 200 as a Messages message, and the usage the upstream reported
    (``created`` unused: a message has no time)."""
    payload = json_object(content)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Untranslatable("its answer has no choice")
    choice = choices[0]
    message = choice.get("message")
    blocks, refused = _blocks(message if isinstance(message, dict) else {})
    stop = "refusal" if refused else stop_reason(choice.get("finish_reason"))
    answer = {
        "id": payload.get("id"),
        "type": "message",
        "role": "assistant",
        "model": payload.get("model"),
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": messages_usage(payload.get("usage")),
    }
    return orjson.dumps(answer), usage_of_payload(payload)


def _blocks(message: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """A chat message's content as Messages blocks (its refusal as text), and whether it
    was a refusal."""
    blocks: list[dict[str, Any]] = []
    said, refusal = _said_text(message.get("content")), message.get("refusal")
    if said:
        blocks.append({"type": "text", "text": said})
    refused = isinstance(refusal, str) and bool(refusal)
    if refused:
        blocks.append({"type": "text", "text": refusal})
    calls = message.get("tool_calls")
    blocks.extend(_tool_use(call) for call in (calls if isinstance(calls, list) else ()))
    return blocks, refused


def _said_text(content: object) -> str:
    """A chat message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else ()
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def _tool_use(call: object) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise Untranslatable("a tool call without its function")
    arguments = function.get("arguments")
    try:
        given = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        given = None
    if not isinstance(given, dict):
        raise Untranslatable("a tool call whose arguments are not a JSON object")
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": given}


# --- errors ----------------------------------------------------------------------------


def _said(content: bytes) -> tuple[str, str | None]:
    """An error body's message and type, in either API's shape (or the body's text)."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode(errors="replace")[:2000], None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return content.decode(errors="replace")[:2000], None
    message, kind = error.get("message"), error.get("type")
    return (
        message if isinstance(message, str) else "",
        kind if isinstance(kind, str) else None,
    )


def messages_error(status: int, content: bytes) -> bytes:
    """An upstream chat error body (OpenAI's shape) in Anthropic's, for ``status``."""
    message, _ = _said(content)
    return orjson.dumps(
        {"type": "error", "error": {"type": error_type(status), "message": message}}
    )


def chat_error(status: int, content: bytes) -> bytes:
    """An upstream Messages error body (Anthropic's shape) in OpenAI's."""
    message, kind = _said(content)
    error = {
        "message": message,
        "type": kind or ("api_error" if status >= 500 else "invalid_request_error"),
        "param": None,
        "code": None,
    }
    return orjson.dumps({"error": error})
