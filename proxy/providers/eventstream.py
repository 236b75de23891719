"""AWS's event stream framing (``application/vnd.amazon.eventstream``), read and written
(pure).

Each message: a 12-byte prelude (its total length, its headers' length, both uint32 big
endian, and the CRC32 of those 8 bytes), its headers, its payload, and the CRC32 of all
that came before. A header: its name's length (uint8) and name, a value type (uint8) and
the value (https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html,
"Event stream encoding"; botocore's ``eventstream`` reads the same).

Nothing read is trusted: both CRCs are checked, lengths must agree with each other and
stay under ``MAX_MESSAGE`` (a message is held whole before it is read, so that is the
most one stream holds), and a stream that ends inside a message is ``Undecodable``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from proxy.providers.framing import Undecodable

__all__ = ["MAX_MESSAGE", "Message", "MessageReader", "encode_message"]

MAX_MESSAGE = 1024 * 1024  # Bedrock's messages carry one answer event each: a few KiB
_MAX_HEADERS = 128 * 1024  # botocore's own bound
_PRELUDE = 12
_CRC = 4
_MIN_MESSAGE = _PRELUDE + _CRC

# Value types and their fixed sizes (None: a uint16 length, then that many bytes).
_TRUE, _FALSE, _BYTES, _STRING = 0, 1, 6, 7
_FIXED = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_VARIABLE = (_BYTES, _STRING)

HeaderValue = str | bytes | bool | int


@dataclass(frozen=True, slots=True)
class Message:
    """One message: its headers (string and byte values as such, booleans, integers;
    other types as their raw bytes) and its payload."""

    headers: dict[str, HeaderValue]
    payload: bytes

    def text(self, name: str) -> str | None:
        """A string header's value (None: absent, or not a string)."""
        value = self.headers.get(name)
        return value if isinstance(value, str) else None


class MessageReader:
    """Messages from a stream's bytes, as they come: ``feed`` each chunk (the messages it
    completed), ``end`` once the stream ended (``Undecodable`` if inside a message)."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._held = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[Message]:
        held = self._held
        held += data
        messages = []
        while len(held) >= _PRELUDE:
            total = self._length(held)
            if len(held) < total:
                break
            messages.append(_message(bytes(held[:total])))
            del held[:total]
        return messages

    def end(self) -> None:
        if self._held:
            raise Undecodable("an event stream cut inside a message")

    def _length(self, held: bytearray) -> int:
        """The total length its prelude announces, checked before the rest is awaited."""
        total, headers = struct.unpack_from(">II", held)
        (crc,) = struct.unpack_from(">I", held, 8)
        if zlib.crc32(held[:8]) != crc:
            raise Undecodable("an event stream message whose prelude fails its CRC")
        if not _MIN_MESSAGE <= total <= self._max or headers > min(_MAX_HEADERS, total):
            raise Undecodable(f"an event stream message of {total} bytes (at most {self._max})")
        if headers > total - _MIN_MESSAGE:
            raise Undecodable("an event stream message whose headers overrun it")
        return int(total)


def _message(raw: bytes) -> Message:
    """One whole message (its prelude checked): its CRC, headers and payload."""
    (crc,) = struct.unpack_from(">I", raw, len(raw) - _CRC)
    if zlib.crc32(raw[:-_CRC]) != crc:
        raise Undecodable("an event stream message that fails its CRC")
    (headers_length,) = struct.unpack_from(">I", raw, 4)
    end = _PRELUDE + headers_length
    return Message(_headers(raw[_PRELUDE:end]), raw[end:-_CRC])


def _headers(raw: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(raw):
            size = raw[at]
            name = raw[at + 1 : at + 1 + size].decode()
            at += 1 + size
            kind = raw[at]
            headers[name], at = _value(raw, kind, at + 1)
    except (IndexError, UnicodeDecodeError, struct.error):
        raise Undecodable("an event stream message with malformed headers") from None
    return headers


def _value(raw: bytes, kind: int, at: int) -> tuple[HeaderValue, int]:
    """A header's value of type ``kind`` at ``at``, and where the next header starts."""
    if kind in (_TRUE, _FALSE):
        return kind == _TRUE, at
    if kind in _VARIABLE:
        (size,) = struct.unpack_from(">H", raw, at)
        value = raw[at + 2 : at + 2 + size]
        if len(value) != size:
            raise IndexError(at)
        return (value.decode() if kind == _STRING else value), at + 2 + size
    size = _FIXED.get(kind)
    if size is None:
        raise Undecodable(f"an event stream header of unknown type {kind}")
    value = raw[at : at + size]
    if len(value) != size:
        raise IndexError(at)
    if kind in (2, 3, 4, 5):
        return int.from_bytes(value, "big", signed=True), at + size
    return value, at + size  # a timestamp or a UUID: not read further


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """A message of string ``headers`` and ``payload`` (the fake upstream's, the tests')."""
    encoded = b"".join(
        struct.pack(">B", len(name.encode()))
        + name.encode()
        + struct.pack(">BH", _STRING, len(value.encode()))
        + value.encode()
        for name, value in headers.items()
    )
    total = _PRELUDE + len(encoded) + len(payload) + _CRC
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + encoded + payload
    return body + struct.pack(">I", zlib.crc32(body))
