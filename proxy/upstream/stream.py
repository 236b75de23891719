"""A streamed upstream answer, passed through chunk by chunk."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from proxy.shapes.sse import UsageTap
from proxy.upstream.encoding import Decoder, Undecodable
from proxy.upstream.redact import StreamRedactor

__all__ = ["StreamBody", "StreamEnd"]

logger = logging.getLogger("proxy.upstream")

StreamEnd = str  # "completed" | "interrupted" (upstream broke off) | "abandoned" (client left)


class StreamBody:
    """Chunks as they arrive, decoded if the upstream compressed them (``decoder``);
    usage is read on the way (``tap``), the upstream key redacted (``redactor``).

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
        decoder: Decoder | None = None,
    ) -> None:
        self._response = response
        self.tap = tap
        self._redactor = redactor
        self._on_first_chunk = on_first_chunk
        self._on_close = on_close
        self._decoder = decoder
        self._stream_error = stream_error  # the API shape's error event
        self._closed = False
        self._end: StreamEnd = "abandoned"
        self.events = 0  # SSE events passed to the client (about a token each)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        first = True
        decoder = self._decoder
        ends = self.tap.reader.ends
        ending = False
        try:
            async for chunk in self._response.aiter_raw():
                if first:
                    first = False
                    self._on_first_chunk()
                for piece in (chunk,) if decoder is None else decoder.feed(chunk):
                    out = self._redactor.feed(self.tap.feed(piece))
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
            rest = self._redactor.feed(self.tap.flush()) + self._redactor.flush()
            if rest:
                yield rest
            self._end = "completed"
        except httpx.HTTPError:
            # The upstream broke off mid-stream. A stream is never retried after its first
            # byte, so it ends with the shape's error event (OpenAI's SDK raises it as an
            # APIError).
            self._end = "interrupted"
            yield self._stream_error("The upstream stream was interrupted.")
        except Undecodable:
            self._end = "interrupted"
            yield self._stream_error("The upstream stream could not be decoded.")
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._response.aclose()
        except Exception:  # closing a broken connection may fail; nothing to return
            logger.debug("closing an upstream stream failed", exc_info=True)
        await self._on_close(self._end)
