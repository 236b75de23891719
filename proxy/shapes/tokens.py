"""Token estimates for budgeting before the upstream has counted (pure).

A rough ~4 characters per token is enough: the estimate is reserved up front and
corrected to the upstream's real ``usage`` afterwards, so it only has to be cheap and
not wildly low.
"""

from __future__ import annotations

from typing import Any

_CHARS_PER_TOKEN = 4
_PER_MESSAGE = 4  # role and framing tokens per chat message
_PER_REQUEST = 3


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
        total = _PER_REQUEST
        for message in messages:
            if isinstance(message, dict):
                total += _PER_MESSAGE + text_tokens(message.get("content"))
        return total
    if "prompt" in body:
        return text_tokens(body["prompt"])
    return text_tokens(body.get("input"))


def completion_tokens(body: dict[str, Any], default: int) -> int:
    """The most completion tokens the request may produce: its own cap (else
    ``default``) for each of its ``n`` choices."""
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * choices
    return default * choices
