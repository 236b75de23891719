"""Reading usage out of a server-sent event stream as it passes (pure).

Chunks are forwarded as they arrive; only events that may carry usage (they hold one of
the shape's ``StreamUsage.markers``) are parsed, and the shape reads them. An event split
across chunks is read once whole: the tap keeps a copy of the unfinished event, at most
``MAX_HELD`` bytes; of a longer one (a Responses API ``response.completed`` repeats the
whole output) only the last ``TAIL`` bytes, whose last ``"usage"`` object is read (it
comes near the end of such an event). When the proxy itself asked for usage (OpenAI's
``stream_options.include_usage``) and the client did not, the usage-only event is removed
so the client sees the stream it asked for: events are then held until they end, each at
most ``MAX_HELD`` bytes (a longer run without an event's end, which is no usage event, is
passed on as it comes).
"""

from __future__ import annotations

import orjson

from proxy.costs import TokenUsage
from proxy.shapes.base import StreamUsage

__all__ = ["MAX_HELD", "TAIL", "UsageTap", "usage_in_tail"]

MAX_HELD = 1 << 20  # bytes of an unfinished event held back: memory stays bounded
TAIL = 64 * 1024  # bytes of an over-long event kept to read its usage
_USAGE_KEY = b'"usage":'


class UsageTap:
    def __init__(self, reader: StreamUsage, strip_usage_event: bool) -> None:
        self.reader = reader
        self.strip_usage_event = strip_usage_event
        self._markers = reader.markers
        self._partial = b""
        self._passing = False  # inside an event longer than MAX_HELD
        # Passing everything on: a copy of the unfinished event (or an over-long one's
        # tail, ``_cut``), read once it ends.
        self._seen: list[bytes] = []
        self._size = 0
        self._cut = False
        self._cut_marked = False

    @property
    def usage(self) -> TokenUsage | None:
        """The usage the stream reported so far (None: none)."""
        return self.reader.usage

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for ``chunk`` (all of it, unless an event is removed)."""
        if not self.strip_usage_event:
            # Fast path: no event ever needs holding back; look for usage only. Usually
            # a chunk ends its events: nothing to keep.
            if not self._seen and chunk.endswith(b"\n\n"):
                if any(m in chunk for m in self._markers):
                    self._read(chunk)
            else:
                self._watch(chunk)
            return chunk
        data = self._partial + chunk
        if self._passing:
            return self._pass_on(data)
        end = data.rfind(b"\n\n")
        if end < 0:
            return self._hold(data)
        complete, self._partial = data[: end + 2], data[end + 2 :]
        if not any(m in complete for m in self._markers):
            return complete
        return self._without_usage_event(complete)

    def _pass_on(self, data: bytes) -> bytes:
        """An over-long event (no usage event is that long) goes on as it comes: holding
        it would hold the client's stream back, and memory unbounded."""
        end = data.find(b"\n\n")
        if end < 0:
            keep = 1 if data.endswith(b"\n") else 0  # its end may span two chunks
            self._partial = data[len(data) - keep :]
            return data[: len(data) - keep]
        self._passing, self._partial = False, b""
        return data[: end + 2] + self.feed(data[end + 2 :])

    def _hold(self, data: bytes) -> bytes:
        """An unfinished event is held back until it ends, as it may be the usage event to
        remove; past ``MAX_HELD`` it cannot be one and is passed on."""
        if len(data) <= MAX_HELD:
            self._partial = data
            return b""
        self._passing, self._partial = True, b""
        return self.feed(data)

    def _without_usage_event(self, complete: bytes) -> bytes:
        """``complete`` events without the usage-only one the proxy asked for (their usage
        read): the client sees the stream it asked for."""
        kept = [e for e in complete.split(b"\n\n") if e and not self._take_usage_event(e)]
        return b"".join(e + b"\n\n" for e in kept)

    def flush(self) -> bytes:
        """Whatever is held back when the stream ends (an event without its blank line
        is read too)."""
        if self._seen and not self.strip_usage_event:
            self._watch(b"\n\n")
        rest, self._partial = self._partial, b""
        return rest

    def _watch(self, chunk: bytes) -> None:
        """Read the events that end in ``chunk`` (with what came of them before)."""
        end = chunk.rfind(b"\n\n")  # -1: none, unless a blank line spans two chunks
        seen = self._seen
        if end < 0 and not (seen and seen[-1].endswith(b"\n") and chunk.startswith(b"\n")):
            self._keep(chunk)
            return
        if seen:
            self._read_held(chunk, end)
        elif any(m in chunk for m in self._markers):  # the usual case: the chunk ends its events
            self._read(chunk[: max(end, 0)])
        if end + 2 < len(chunk):
            self._keep(chunk[end + 2 :])

    def _read_held(self, chunk: bytes, end: int) -> None:
        """Read the held events together with those ``chunk`` ends at ``end`` (-1: its
        first byte ends the last held one): an event is parsed only whole."""
        head = b"".join(self._seen)
        complete = head[:-1] if end < 0 else head + chunk[:end]
        self._seen, self._size = [], 0
        if self._cut:  # its first event is an over-long one's tail
            self._cut = False
            first, _, complete = complete.partition(b"\n\n")
            if self._cut_marked:
                usage = usage_in_tail(first)
                if usage is not None:
                    self.reader.record({"usage": usage})
        if any(m in complete for m in self._markers):
            self._read(complete)

    def _read(self, events: bytes) -> None:
        for event in events.split(b"\n\n"):
            if any(m in event for m in self._markers):
                self._record(event)

    def _keep(self, piece: bytes) -> None:
        """Copy a piece of an unfinished event (only the tail past ``MAX_HELD``): kept
        as a list, joined once the event ends."""
        self._seen.append(piece)
        self._size += len(piece)
        limit = TAIL if self._cut else MAX_HELD
        if self._size > limit:
            if self._cut and self._size <= 2 * TAIL:
                return  # trimmed in steps: not at every chunk
            whole = b"".join(self._seen)
            if not self._cut:  # its start names it (the tail may not)
                self._cut_marked = any(m in whole for m in self._markers)
            self._cut = True
            tail = whole[-TAIL:]
            self._seen, self._size = [tail], len(tail)

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


def usage_in_tail(event: bytes) -> dict[str, object] | None:
    """The last ``"usage": {...}`` object in the tail of an event too long to parse
    whole (its counts hold no braces in strings); None: none readable."""
    at = event.rfind(_USAGE_KEY)
    if at < 0:
        return None
    start = event.find(b"{", at + len(_USAGE_KEY))
    if start < 0 or event[at + len(_USAGE_KEY) : start].strip():
        return None  # "usage": null, or not an object
    depth = 0
    for i in range(start, min(len(event), start + 4096)):
        byte = event[i]
        if byte == 0x7B:  # {
            depth += 1
        elif byte == 0x7D:  # }
            depth -= 1
            if depth == 0:
                try:
                    usage = orjson.loads(event[start : i + 1])
                except orjson.JSONDecodeError:
                    return None
                return usage if isinstance(usage, dict) else None
    return None
