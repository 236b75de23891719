"""Keeping the deployment's upstream key out of everything passed back to the client (pure).

Some OpenAI-compatible servers quote the credentials they received in their error answers
(OpenAI quotes part of a wrong key). Whatever the upstream says is passed through as bytes,
so the key is replaced where it appears *as a credential*: a whole token, not inside a
longer word or a base64 string, in bodies of every status, in the headers that are passed
on, and in streamed chunks, including a key split across two chunks.

Only keys that can be secrets are redacted (``redactable``): people put dummy keys such
as ``x``, ``token`` or ``EMPTY`` in front of local servers, and replacing those wherever
they occur would rewrite answers (``"index"``, ``prompt_tokens``, base64 embeddings).
Such keys are named at start-up (``config/secrets.py``). The check is one substring
search per body or chunk; nothing is copied when the key is absent.
"""

from __future__ import annotations

import functools
import re

from proxy.config.secrets import secret_like

__all__ = [
    "REDACTED",
    "StreamRedactor",
    "redact",
    "redact_headers",
    "redactable",
]

REDACTED = "sk-...redacted"
_REDACTED = REDACTED.encode()

# A byte that can continue a key or a base64 string: a key next to one is not a key there.
_WORD = rb"A-Za-z0-9+/_\-"


@functools.lru_cache(maxsize=256)
def redactable(key: str) -> bytes:
    """The key as the bytes to redact; empty when it cannot be a secret (no key, too
    short, a known placeholder, one repeated character): nothing is redacted then."""
    if not secret_like(key):
        return b""
    return key.encode()


@functools.lru_cache(maxsize=256)
def _pattern(secret: bytes) -> re.Pattern[bytes]:
    """``secret`` as a whole token: neither preceded nor followed by a key's byte (nor,
    after it, by base64's padding)."""
    return re.compile(rb"(?<![" + _WORD + rb"])" + re.escape(secret) + rb"(?![" + _WORD + rb"=])")


def redact(data: bytes, secret: bytes) -> bytes:
    if secret and secret in data:
        return _pattern(secret).sub(_REDACTED, data)
    return data


def redact_headers(headers: dict[str, str], secret: str) -> dict[str, str]:
    if not secret or not any(secret in value for value in headers.values()):
        return headers
    key = secret.encode()
    return {name: _redact_text(value, key) for name, value in headers.items()}


def _redact_text(text: str, secret: bytes) -> str:
    """``redact`` for text, whatever its characters (a round trip for any ``str``)."""
    data = text.encode("utf-8", "surrogateescape")
    return redact(data, secret).decode("utf-8", "surrogateescape")


class StreamRedactor:
    """``feed`` each chunk, then ``flush``: the key never crosses a chunk boundary whole.

    A chunk ending with the start of the key holds those few bytes back until the next
    chunk, and one ending with the whole key holds it until the next byte says whether
    it is a whole token (an SSE event ends with a blank line, so in practice nothing
    waits)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._held = b""
        self._before = b""  # the last byte passed on: what precedes ``_held``

    def feed(self, chunk: bytes) -> bytes:
        secret = self._secret
        if not secret:
            return chunk
        data = self._held + chunk if self._held else chunk
        return self._pass(data, final=False)

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        if not held or not self._secret:
            return held
        return self._pass(held, final=True)

    def _pass(self, data: bytes, final: bool) -> bytes:
        """``data`` redacted, but for the end that the next chunk may complete (held)."""
        secret = self._secret
        keep = len(data) if final else len(data) - _partial_tail(data, secret)
        out: list[bytes] = []
        at = 0
        if secret in data:
            offset = len(self._before)
            text = self._before + data
            for match in _pattern(secret).finditer(text, offset):
                start, end = match.start() - offset, match.end() - offset
                if end == len(data) and not final:  # what follows decides: hold it
                    keep = min(keep, start)
                    break
                out.append(data[at:start])
                out.append(_REDACTED)
                at = end
        keep = max(keep, at)
        out.append(data[at:keep])
        self._held = data[keep:]
        if keep:
            self._before = data[keep - 1 : keep]
        return b"".join(out)


def _partial_tail(data: bytes, secret: bytes) -> int:
    """The length of the longest end of ``data`` that begins ``secret`` without being
    all of it (0: none)."""
    start = max(len(data) - len(secret) + 1, 0)
    first = secret[:1]
    at = data.find(first, start)
    while at >= 0:
        if secret.startswith(data[at:]):
            return len(data) - at
        at = data.find(first, at + 1)
    return 0
