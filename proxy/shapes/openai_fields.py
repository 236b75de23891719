"""The request fields the proxy itself reads, checked before it reads them (pure).

The body is forwarded as bytes, so the upstream judges everything else; but a field the
proxy uses (to stream, to estimate tokens, to ask for usage) must have the shape it
expects, or the client gets a 400 naming it: never a 500 from a value nobody checked.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

__all__ = ["check", "check_messages", "check_stream", "invalid"]

_COUNTS = ("max_tokens", "max_completion_tokens", "n")


def check(body: dict[str, Any]) -> None:
    """Raise InvalidRequest (with ``param``) for a field of the wrong shape."""
    check_stream(body)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            invalid("stream_options", "an object")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            invalid("stream_options.include_usage", "a boolean")
    for name in _COUNTS:
        value = body.get(name)
        if value is not None and (type(value) is not int or value < (1 if name == "n" else 0)):
            invalid(name, "a positive integer" if name == "n" else "a non-negative integer")
    check_messages(body)


def check_stream(body: dict[str, Any]) -> None:
    """``stream``: a boolean, if given (the Messages API's too)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        invalid("stream", "a boolean")


def check_messages(body: dict[str, Any]) -> None:
    """``messages``: an array of objects, if given (the Messages API's too)."""
    messages = body.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            invalid("messages", "an array of message objects")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                invalid(f"messages[{i}]", "an object")


def invalid(param: str, shape: str) -> None:
    raise InvalidRequest(f"'{param}' must be {shape}.", code="invalid_type", param=param)
