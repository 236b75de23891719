"""Reading usage out of a server-sent event stream as it passes (pure).

Chunks are forwarded as they arrive; only events that may carry usage (they hold one of
the shape's ``StreamUsage.markers``) are parsed, and the shape reads them. When the
proxy itself asked for usage (OpenAI's ``stream_options.include_usage``) and the client
did not, the usage-only event is removed so the client sees the stream it
asked for: events are then held until they end, each at most ``MAX_HELD`` bytes (a
longer run without an event's end, which is no usage event, is passed on as it comes).
"""

from __future__ import annotations

import orjson

from proxy.costs import TokenUsage
from proxy.shapes.base import StreamUsage

__all__ = ["MAX_HELD", "UsageTap"]

MAX_HELD = 1 << 20  # bytes of an unfinished event held back: memory stays bounded


class UsageTap:
    def __init__(self, reader: StreamUsage, strip_usage_event: bool) -> None:
        self.reader = reader
        self.strip_usage_event = strip_usage_event
        self._markers = reader.markers
        self._partial = b""
        self._passing = False  # inside an event longer than MAX_HELD

    @property
    def usage(self) -> TokenUsage | None:
        """The usage the stream reported so far (None: none)."""
        return self.reader.usage

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for ``chunk`` (all of it, unless an event is removed)."""
        if not self.strip_usage_event and not self._partial:
            # Fast path: no event ever needs holding back; look for usage only.
            if any(m in chunk for m in self._markers):
                self._scan(chunk)
            return chunk
        data = self._partial + chunk
        if self._passing:  # an over-long event: passed on as it comes, until its end
            end = data.find(b"\n\n")
            if end < 0:
                keep = 1 if data.endswith(b"\n") else 0  # its end may span two chunks
                self._partial = data[len(data) - keep :]
                return data[: len(data) - keep]
            self._passing, self._partial = False, b""
            return data[: end + 2] + self.feed(data[end + 2 :])
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) <= MAX_HELD:
                self._partial = data
                return b""
            self._passing, self._partial = True, b""  # no usage event is that long
            return self.feed(data)
        complete, self._partial = data[: end + 2], data[end + 2 :]
        if not any(m in complete for m in self._markers):
            return complete
        kept = [e for e in complete.split(b"\n\n") if e and not self._take_usage_event(e)]
        return b"".join(e + b"\n\n" for e in kept)

    def flush(self) -> bytes:
        """Whatever is held back when the stream ends."""
        rest, self._partial = self._partial, b""
        return rest

    def _scan(self, chunk: bytes) -> None:
        for event in chunk.split(b"\n\n"):
            if any(m in event for m in self._markers):
                self._record(event)

    def _take_usage_event(self, event: bytes) -> bool:
        """Record usage from ``event``; true if it is a usage-only event to remove."""
        if not any(m in event for m in self._markers):
            return False
        payload = self._record(event)
        return (
            self.strip_usage_event
            and isinstance(payload, dict)
            and self.reader.added_by_proxy(payload)
        )

    def _record(self, event: bytes) -> object:
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    payload = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    return None
                if isinstance(payload, dict):
                    self.reader.record(payload)
                return payload
        return None
