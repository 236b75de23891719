"""A streamed upstream answer, passed through chunk by chunk."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from proxy.shapes.sse import UsageTap
from proxy.translate import EventStream, Untranslatable
from proxy.upstream.encoding import StreamDecoder, Undecodable
from proxy.upstream.redact import StreamRedactor

__all__ = ["StreamBody", "StreamEnd"]

logger = logging.getLogger("proxy.upstream")

StreamEnd = str  # "completed" | "interrupted" (upstream broke off) | "abandoned" (client left)


class StreamBody:
    """Chunks as they arrive, decoded if the upstream compressed them (``decoder``);
    usage is read on the way (``tap``, in the upstream's API), then translated to the
    client's API when it is another (``translation``: proxy/translate; ``ends``: the
    client's API's last events), the upstream key redacted (``redactor``).

    ``aclose`` closes the upstream response and calls ``on_close`` exactly once, even when
    iteration never started (the client left before the first byte).
    """

    def __init__(
        self,
        response: httpx.Response,
        tap: UsageTap,
        redactor: StreamRedactor,
        on_first_chunk: Callable[[], None],
        on_close: Callable[[StreamEnd], Awaitable[None]],
        stream_error: Callable[[str], bytes],
        decoder: StreamDecoder | None = None,
        translation: EventStream | None = None,
        ends: tuple[bytes, ...] | None = None,
    ) -> None:
        self._response = response
        self.tap = tap
        self._redactor = redactor
        self._on_first_chunk = on_first_chunk
        self._on_close = on_close
        self._decoder = decoder
        self._stream_error = stream_error  # the API shape's error event
        self._translation = translation
        self._ends = tap.reader.ends if ends is None else ends
        self._closed = False
        self._end: StreamEnd = "abandoned"
        self.events = 0  # SSE events passed to the client (about a token each)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        first = True
        decoder = self._decoder
        ends = self._ends
        ending = False
        try:
            async for chunk in self._response.aiter_raw():
                if first:
                    first = False
                    self._on_first_chunk()
                for piece in (chunk,) if decoder is None else decoder.feed(chunk):
                    out = self._passed(piece)
                    if out:
                        self.events += out.count(b"data:")
                        yield out
                        ending = ending or any(end in out for end in ends)
                        if ending and out.endswith(b"\n\n"):
                            # The last event sent: a client leaving now (before the
                            # upstream's EOF) read the whole answer.
                            self._end = "completed"
            if decoder is not None:
                decoder.end()
            rest = self._rest()
            if rest:
                yield rest
            self._end = "completed"
        except httpx.HTTPError:
            # The upstream broke off mid-stream. A stream is never retried after its first
            # byte, so it ends with the shape's error event (OpenAI's SDK raises it as an
            # APIError).
            self._end = "interrupted"
            yield self._stream_error("The upstream stream was interrupted.")
        except (Undecodable, Untranslatable) as exc:
            self._end = "interrupted"
            yield self._stream_error(_broken(exc))
        finally:
            await self.aclose()

    def _passed(self, piece: bytes) -> bytes:
        """What the client gets of ``piece``: its usage read, translated, redacted."""
        tapped = self.tap.feed(piece)
        if self._translation is not None:
            tapped = self._translation.feed(tapped)
        return self._redactor.feed(tapped)

    def _rest(self) -> bytes:
        """What the client gets once the upstream's stream ended: whatever was held."""
        tail = self.tap.flush()
        if self._translation is not None:
            tail = self._translation.feed(tail) + self._translation.flush()
        return self._redactor.feed(tail) + self._redactor.flush()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._response.aclose()
        except Exception:  # closing a broken connection may fail; nothing to return
            logger.debug("closing an upstream stream failed", exc_info=True)
        finally:  # even cancelled while closing: the stream's bookkeeping is its end's
            await self._on_close(self._end)


def _broken(exc: Exception) -> str:
    """What a stream's end says of an upstream stream it could not pass on."""
    if isinstance(exc, Untranslatable):
        return "The upstream stream could not be translated."
    return "The upstream stream could not be decoded."
