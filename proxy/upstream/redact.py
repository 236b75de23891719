"""Keeping the deployment's upstream key out of everything passed back to the client (pure).

Some OpenAI-compatible servers quote the credentials they received in their error answers
(OpenAI quotes part of a wrong key). Whatever the upstream says is passed through as bytes,
so the key is replaced wherever it appears: in bodies of every status, in the headers that
are passed on, and in streamed chunks, including a key split across two chunks. The check
is one substring search per body or chunk; nothing is copied when the key is absent.
"""

from __future__ import annotations

__all__ = ["REDACTED", "StreamRedactor", "redact", "redact_headers"]

REDACTED = "sk-...redacted"
_REDACTED = REDACTED.encode()


def redact(data: bytes, secret: bytes) -> bytes:
    if secret and secret in data:
        return data.replace(secret, _REDACTED)
    return data


def redact_headers(headers: dict[str, str], secret: str) -> dict[str, str]:
    if not secret or not any(secret in value for value in headers.values()):
        return headers
    return {name: value.replace(secret, REDACTED) for name, value in headers.items()}


class StreamRedactor:
    """``feed`` each chunk, then ``flush``: the key never crosses a chunk boundary whole.

    Only a chunk ending with the start of the key holds those few bytes back until the
    next chunk (an SSE event ends with a blank line, so in practice nothing waits)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        secret = self._secret
        if not secret:
            return chunk
        data = self._held + chunk if self._held else chunk
        data = redact(data, secret)
        keep = _partial_tail(data, secret)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _partial_tail(data: bytes, secret: bytes) -> int:
    """The length of the longest end of ``data`` that begins ``secret`` (0: none)."""
    start = max(len(data) - len(secret) + 1, 0)
    first = secret[:1]
    at = data.find(first, start)
    while at >= 0:
        if secret.startswith(data[at:]):
            return len(data) - at
        at = data.find(first, at + 1)
    return 0
