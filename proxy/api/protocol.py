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
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HEADER_TIMEOUT_ENV", "HeaderTimeoutProtocol"]

HEADER_TIMEOUT_ENV = "LLM_PROXY_HEADER_TIMEOUT"
DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderTimeoutProtocol(HttpToolsProtocol):
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._start_header_timer()

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _start_header_timer(self) -> None:
        timeout = float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT)
        self._header_timer = self.loop.call_later(timeout, self._headers_too_slow)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request being served
            self.transport.close()
