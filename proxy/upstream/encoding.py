"""Bodies an upstream sent compressed although it was asked for ``identity`` (pure).

The proxy asks every upstream for ``accept-encoding: identity``, and neither transport
decodes (client.py, lean.py), yet some servers gzip anyway. Such a body is decoded here
before anything reads it (usage, redaction) or passes it on, so the client gets the
bytes its answer's headers describe (the proxy passes no ``content-encoding`` on) and
the token budgets see the real usage. Decoding is bounded: a buffered body's output
stops at the size it may have (``AnswerTooLarge``, a gzip bomb included), a stream's
comes in pieces of at most ``PIECE`` bytes. A body that does not decode, or an encoding
the proxy does not speak, raises ``Undecodable``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from proxy.providers.framing import Reframer, StreamDecoder, Undecodable
from proxy.upstream.interface import AnswerTooLarge

__all__ = [
    "PIECE",
    "Decoder",
    "Reframed",
    "Reframer",
    "StreamDecoder",
    "Undecodable",
    "decoder_for",
]

PIECE = 64 * 1024  # the most a stream's decoder produces from one step
_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS  # either header, detected (``deflate`` is zlib's)
_DECODED = {"gzip", "x-gzip", "deflate"}


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """The decoder of a body sent with this ``content-encoding`` (None: not encoded)."""
    if content_encoding is None:
        return None
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding not in _DECODED:
        raise Undecodable(f"an encoding the proxy does not decode ({coding[:40]})")
    return Decoder(coding)


class Decoder:
    """One body's gzip (or zlib) decoding: whole (``whole``) or streamed (``feed``, then
    ``end``). Concatenated gzip members decode as one body, as gzip's own tools do."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._inflate = zlib.decompressobj(_GZIP_OR_ZLIB)

    def whole(self, data: bytes, limit: int | None) -> bytes:
        """``data`` decoded, at most ``limit`` bytes of it (``AnswerTooLarge`` past it)."""
        out = bytearray()
        for piece in self._pieces(data, PIECE):
            out += piece
            if limit is not None and len(out) > limit:
                raise AnswerTooLarge(limit)
        self.end()
        return bytes(out)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` decodes to so far, in pieces of at most ``PIECE`` bytes."""
        return self._pieces(data, PIECE)

    def end(self) -> None:
        """The body is over: it must have been a complete one."""
        if not self._inflate.eof:
            raise Undecodable(f"a {self.coding} body cut short")

    def _pieces(self, data: bytes, size: int) -> Iterator[bytes]:
        try:
            while data:
                if self._inflate.eof:  # another gzip member follows
                    self._inflate = zlib.decompressobj(_GZIP_OR_ZLIB)
                piece = self._inflate.decompress(data, size)
                # What is left: input held back by the size bound, or after a member's end.
                data = self._inflate.unconsumed_tail or self._inflate.unused_data
                if piece:
                    yield piece
        except zlib.error as exc:
            raise Undecodable(f"a corrupt {self.coding} body") from exc


class Reframed:
    """A stream's content-encoding undone (``decoder``; None: not encoded), then its
    framing read (``reframer``)."""

    def __init__(self, decoder: Decoder | None, reframer: Reframer) -> None:
        self._decoder = decoder
        self._reframer = reframer

    def feed(self, data: bytes) -> Iterator[bytes]:
        pieces = (data,) if self._decoder is None else self._decoder.feed(data)
        for piece in pieces:
            yield from self._reframer.feed(piece)

    def end(self) -> None:
        if self._decoder is not None:
            self._decoder.end()
        self._reframer.end()
