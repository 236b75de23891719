"""Token estimates for budgeting before the upstream has counted (pure).

A rough ~4 characters per token is enough: the estimate is reserved up front and
corrected to the upstream's real ``usage`` afterwards, so it only has to be cheap and
not wildly low.
"""

from __future__ import annotations

from typing import Any

import orjson

_CHARS_PER_TOKEN = 4
PER_MESSAGE = 4  # role and framing tokens per chat message
PER_REQUEST = 3


def text_tokens(value: Any) -> int:
    """Estimated tokens of text, content parts or token ids, however nested. Walked
    with an explicit stack: content nested thousands of levels deep (an attack, not a
    prompt) costs time in proportion to its size, never a RecursionError."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) // _CHARS_PER_TOKEN + 1
        elif isinstance(item, list):
            if item and all(type(v) is int for v in item):
                total += len(item)  # already token ids
            else:
                stack.extend(item)
        elif isinstance(item, dict):
            # Content parts: {"type": "text", "text": ...}; images etc. count a flat amount.
            if "text" in item:
                stack.append(item["text"])
            else:
                total += 85
    return total


def prompt_tokens(body: dict[str, Any]) -> int:
    """Estimated prompt tokens of a chat, completion or embedding request body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = PER_REQUEST
        for message in messages:
            if isinstance(message, dict):
                total += PER_MESSAGE + text_tokens(message.get("content"))
        return total
    if "prompt" in body:
        return text_tokens(body["prompt"])
    return text_tokens(body.get("input"))


def messages_input_tokens(body: dict[str, Any]) -> int:
    """Estimated input tokens of an Anthropic Messages request: its ``messages`` as chat
    messages and its ``system`` prompt as one more, their blocks as ``block_tokens``
    reads them, and its ``tools`` by their JSON's size (a tool's schema is read by the
    model too)."""
    total = PER_REQUEST
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            total += PER_MESSAGE + block_tokens(message.get("content"))
    system = body.get("system")
    if system is not None:
        total += PER_MESSAGE + block_tokens(system)
    return total + json_tokens(body.get("tools"))


def block_tokens(content: Any) -> int:
    """Anthropic content: a string, or blocks: text; a tool result's ``content`` (an
    agent's largest input: files, command output); a tool call's ``input`` by its JSON's
    size; any other block (an image, a document) a flat amount."""
    total = 0
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict) and "text" not in item and "content" in item:
            stack.append(item["content"])
        elif isinstance(item, dict) and "text" not in item and "input" in item:
            total += json_tokens(item["input"])
        else:
            total += text_tokens(item)
    return total


def json_tokens(value: Any) -> int:
    """Tokens of a JSON value by its serialized size (0 for none)."""
    if value is None or value == [] or value == {}:
        return 0
    try:
        return len(orjson.dumps(value)) // _CHARS_PER_TOKEN + 1
    except orjson.JSONEncodeError:  # nested deeper than orjson dumps: still some
        return text_tokens(value)


def choices(body: dict[str, Any]) -> int:
    """How many completions an OpenAI request asks for (``n``; 1 unless a positive
    integer says otherwise)."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def completion_tokens(body: dict[str, Any], default: int) -> int:
    """The most completion tokens the request may produce: its own cap (else
    ``default``) for each of its ``n`` choices."""
    n = choices(body)
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * n
    return default * n
