"""What every upstream transport hands over beyond httpx's API (client.py, lean.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

__all__ = [
    "HEADER_MAP",
    "AnswerTooLarge",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamStream",
]

# A response extension: its headers as a dict, names lowercase (the last of repeats).
HEADER_MAP = "proxy.header_map"


class AnswerTooLarge(Exception):
    """A body read whole ran past the bound it was read with (``UpstreamStream.read``);
    the connection is not reused."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The upstream's answer is over {limit} bytes.")
        self.limit = limit


class UpstreamStream(httpx.AsyncByteStream):
    """An upstream answer's body: streamed chunk by chunk as it arrives, or read whole."""

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body in one go (a buffered answer), at most ``limit`` bytes
        (``AnswerTooLarge`` past it; None: no bound)."""
        raise NotImplementedError


class _HeadersWhenAsked:
    """``headers`` as an ``httpx.Headers`` built from ``_header_source`` on first use.

    The two classes below set the attributes httpx's constructors set themselves, and
    do not call them: those build an empty ``Headers`` only to drop it, copy the URL and
    parse nothing else for a request already built (3.3 us a request, 0.8 without them;
    docs/performance.md). tests/upstream/test_interface.py checks that they end with
    exactly the attributes httpx's own constructors leave, so an httpx that adds one is
    caught there, not on the request path."""

    _header_source: Mapping[str, str] | list[tuple[bytes, bytes]]
    _headers: httpx.Headers | None = None

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._header_source)
        return self._headers

    @headers.setter
    def headers(self, value: httpx.Headers) -> None:
        self._headers = value


class UpstreamRequest(_HeadersWhenAsked, httpx.Request):
    """The proxy's upstream request (``forward.build_request``): a POST whose body is in
    hand (or a stored object's GET, DELETE, with an empty one). Its headers stay the
    plain dict the proxy built (``fields``, sent as they are) and become an
    ``httpx.Headers`` only if something asks (normalising them is a tenth of the lean
    transport's own cost); ``target`` is its URL as text."""

    def __init__(
        self,
        url: httpx.URL,
        target: str,
        fields: dict[str, str],
        payload: bytes,
        extensions: Mapping[str, Any],
        method: str = "POST",
    ) -> None:
        self.method = method
        self.url = url
        self.extensions = dict(extensions)
        self.stream = httpx.ByteStream(payload)
        self._content = payload  # read already
        self.fields = self._header_source = fields
        self.target = target
        self._headers = None


class UpstreamResponse(_HeadersWhenAsked, httpx.Response):
    """An upstream answer whose raw headers become an ``httpx.Headers`` only if something
    asks: the proxy reads them from the ``HEADER_MAP`` extension."""

    def __init__(
        self,
        status_code: int,
        raw_headers: list[tuple[bytes, bytes]],
        stream: httpx.AsyncByteStream,
        request: httpx.Request,
        extensions: dict[str, Any],
    ) -> None:
        self.status_code = status_code
        self._request: httpx.Request | None = request
        self.next_request: httpx.Request | None = None
        self.extensions = extensions
        self.history: list[httpx.Response] = []
        self.is_closed = False
        self.is_stream_consumed = False
        self.default_encoding = "utf-8"
        self.stream = stream
        self._num_bytes_downloaded = 0
        self._header_source = raw_headers
        self._headers = None
