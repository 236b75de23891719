"""The HTTP/1.1 protocol uvicorn runs, with a bound on how long request headers may take.

uvicorn closes idle keep-alive connections but lets a connection send its headers as
slowly as it likes: a few hundred connections trickling a header byte now and then hold
the server's sockets and memory forever (slowloris). Here a timer starts when a
connection opens and when each new request begins, and stops once its headers are
complete; a connection that has not finished its headers by then is closed. The timeout
is read from the environment (``HEADER_TIMEOUT_ENV``, set by the CLI from
``server.header_timeout``) so spawned workers get it too.

A request asking to upgrade to anything but a WebSocket (``Upgrade: h2c``, as ``curl
--http2`` sends over plain HTTP) is served as the HTTP/1.1 request it also is (RFC 9110
7.8: a server may ignore an upgrade). httptools stops at such a request's head and
takes what follows for the new protocol; uvicorn then serves it without its body. Here
the parser is handed the body again behind a head of its own framing (``_ignore_upgrade``).
"""

from __future__ import annotations

import asyncio
import functools
import os

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HEADER_TIMEOUT_ENV", "HeaderTimeoutProtocol"]

HEADER_TIMEOUT_ENV = "LLM_PROXY_HEADER_TIMEOUT"
DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderTimeoutProtocol(HttpToolsProtocol):
    # One timer per connection, re-armed only when it fires: a request on a busy
    # keep-alive connection costs an attribute write, not a timer.
    _header_timer: asyncio.TimerHandle | None = None
    _headers_since: float | None = None  # when the request now awaiting headers began
    # The parser is reading the body of a request whose upgrade was ignored, behind a
    # head made for it: that head's callbacks are not a new request's.
    _continuing = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting_headers()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a non-WebSocket upgrade is ignored (``_ignore_upgrade``)."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
        except httptools.HttpParserUpgrade as upgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._ignore_upgrade(data[upgrade.args[0] :])

    def _ignore_upgrade(self, rest: bytes) -> None:
        """The request just parsed asked for an upgrade the proxy does not make: feed
        the parser (which stopped at its head and took it as done) a head with the
        request's framing and then ``rest``, so its body reaches the request's cycle."""
        framing = b""
        for name, value in self.headers:
            if name in (b"content-length", b"transfer-encoding"):
                framing += name + b": " + value + b"\r\n"
        if framing and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.more_body = True  # the parser ended it at its head
            self._continuing = True
            rest = b"POST / HTTP/1.1\r\n" + framing + b"\r\n" + rest
        if rest:
            self.data_received(rest)

    def on_message_begin(self) -> None:
        if self._continuing:
            return
        super().on_message_begin()
        self._awaiting_headers()

    def on_url(self, url: bytes) -> None:
        if not self._continuing:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._continuing:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._continuing:
            self._continuing = False
            return
        self._headers_since = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _awaiting_headers(self) -> None:
        if self._headers_since is None:
            self._headers_since = self.loop.time()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(_timeout(), self._check_headers)

    def _check_headers(self) -> None:
        self._header_timer = None
        since = self._headers_since
        if since is None:
            return  # no request awaiting headers: the next one arms the timer again
        left = since + _timeout() - self.loop.time()
        if left > 0:
            self._header_timer = self.loop.call_later(left, self._check_headers)
        elif self.cycle is None or self.cycle.response_complete:  # none being served
            self.transport.close()


@functools.cache
def _timeout() -> float:
    """Read once per process (the CLI sets it before the server starts)."""
    return float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT)
