"""The HTTP/1.1 protocol uvicorn runs, with a bound on how long request headers may take.

uvicorn closes idle keep-alive connections but lets a connection send its headers as
slowly as it likes: a few hundred connections trickling a header byte now and then hold
the server's sockets and memory forever (slowloris). Here a timer starts when a
connection opens and when each new request begins, and stops once its headers are
complete; a connection that has not finished its headers by then is closed. The timeout
is read from the environment (``HEADER_TIMEOUT_ENV``, set by the CLI from
``server.header_timeout``) so spawned workers get it too.
"""

from __future__ import annotations

import asyncio
import functools
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HEADER_TIMEOUT_ENV", "HeaderTimeoutProtocol"]

HEADER_TIMEOUT_ENV = "LLM_PROXY_HEADER_TIMEOUT"
DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderTimeoutProtocol(HttpToolsProtocol):
    # One timer per connection, re-armed only when it fires: a request on a busy
    # keep-alive connection costs an attribute write, not a timer.
    _header_timer: asyncio.TimerHandle | None = None
    _headers_since: float | None = None  # when the request now awaiting headers began

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers()

    def on_headers_complete(self) -> None:
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
