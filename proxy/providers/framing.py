"""How a streamed answer's bytes become server-sent events, as a provider frames them (pure):
the protocols a provider's reframer follows (``base.Wire.reframer``: Bedrock's AWS event
stream) and the error of a body or frame that cannot be read. Below ``upstream/``, which
composes them with a content-encoding's decoder (``upstream/encoding.Reframed``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["Reframer", "StreamDecoder", "Undecodable"]


class Undecodable(Exception):
    """A body whose content-encoding or framing the proxy cannot undo (unknown, corrupt,
    or cut short)."""


class StreamDecoder(Protocol):
    """What a stream's bytes pass through before anything reads them: ``feed`` each
    chunk as it comes, then ``end`` (raises ``Undecodable`` on what it cannot read, or a
    stream cut short)."""

    def feed(self, data: bytes) -> Iterable[bytes]: ...

    def end(self) -> None: ...


class Reframer(StreamDecoder, Protocol):
    """One streamed answer's framing turned into server-sent events of the API it speaks
    (Bedrock's AWS event stream: each frame's payload an event): a provider's
    (``providers.base.Wire.reframer``)."""
