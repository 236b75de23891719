"""The HTTP/1.1 protocol uvicorn runs, with bounds on how long a request's headers and
body may take, and the contract's JSON for a request it cannot parse.

uvicorn closes idle keep-alive connections but lets a connection send its headers as
slowly as it likes: a few hundred connections trickling a header byte now and then hold
the server's sockets and memory forever (slowloris). Here a timer starts when a
connection opens and when each new request begins, and stops once its headers are
complete; a connection that has not finished its headers by then is closed. The same
timer bounds a body the proxy answered before reading it (a wrong key, too large):
uvicorn discards what still arrives, and a body trickling on past ``body_timeout`` has
its connection closed (a body still being read is the endpoint's: 408,
``forwarding.py``). The timeouts are read from the environment (``HEADER_TIMEOUT_ENV``,
``BODY_TIMEOUT_ENV``, set by the CLI from ``server.header_timeout`` and
``server.body_timeout``) so spawned workers get them too. The same timer also keeps
uvicorn's keep-alive timeout (an idle connection closed once it has passed), where
uvicorn makes a timer per reply and cancels it at the next request's first bytes: the
timer never waits longer than the keep-alive timeout, so it finds an idle connection
before its time and closes it right then.

A request line or header uvicorn's parser refuses gets the contract's JSON 400 (with its
``x-request-id``), not uvicorn's plain text, in the error shape of the API its path
belongs to (``shapes.surface``: Anthropic's under ``/v1/messages``) when the parser read
the request's target before it failed (a bad header, a bad version), else OpenAI's.

A request asking to upgrade to anything but a WebSocket (``Upgrade: h2c``, as ``curl
--http2`` sends over plain HTTP) is served as the HTTP/1.1 request it also is (RFC 9110
7.8: a server may ignore an upgrade). httptools stops at such a request's head and
takes what follows for the new protocol; uvicorn then serves it without its body. Here
the parser is handed the body again behind a head of its own framing (``_ignore_upgrade``).

An HTTP/1.0 client cannot read a chunked body (RFC 9112 6.1), which uvicorn sends it
for every reply without a ``content-length`` (a stream): its reply without one goes
unframed instead, ended by closing the connection (``CloseDelimited``).
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from proxy.api import CLOSE_DELIMITED
from proxy.errors import InvalidRequest
from proxy.request.request_ids import HEADER, new_request_id
from proxy.shapes import surface

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application, ASGISendEvent, HTTPResponseStartEvent

__all__ = ["BODY_TIMEOUT_ENV", "HEADER_TIMEOUT_ENV", "CloseDelimited", "HeaderTimeoutProtocol"]

HEADER_TIMEOUT_ENV = "LLM_PROXY_HEADER_TIMEOUT"
BODY_TIMEOUT_ENV = "LLM_PROXY_BODY_TIMEOUT"
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
_SHORTEST_PERIOD = 0.05  # seconds: a keep-alive timeout of 0 must not spin the timer


class HeaderTimeoutProtocol(HttpToolsProtocol):
    # One timer per connection, re-armed only when it fires: a request on a busy
    # keep-alive connection costs attribute writes, not a timer.
    _header_timer: asyncio.TimerHandle | None = None
    _headers_since: float | None = None  # when the request now awaiting headers began
    _body_since: float | None = None  # when the request now awaiting its body's end did
    _idle_since: float | None = None  # when the connection's last reply went, none since
    # The parser is reading the body of a request whose upgrade was ignored, behind a
    # head made for it: that head's callbacks are not a new request's.
    _continuing = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting_headers()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a non-WebSocket upgrade is ignored (``_ignore_upgrade``)."""
        self._idle_since = None
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
        self._headers_arrived()
        super().on_headers_complete()

    def _headers_arrived(self) -> None:
        """The request's headers are complete: from now on its body's timeout counts."""
        # The body's time counts from the request's start (no clock read per request).
        self._body_since, self._headers_since = self._headers_since, None
        timer = self._header_timer
        if self._body_since is not None and timer is not None:
            deadline = self._body_since + _body_timeout()
            if timer.when() > deadline:  # a body timeout shorter than the header timeout
                timer.cancel()
                self._header_timer = self.loop.call_at(deadline, self._check_deadlines)

    def on_message_complete(self) -> None:
        self._body_since = None
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """uvicorn's, but an HTTP/1.0 request's cycle sends an unframed reply unchunked
        (and its scope says so: ``CLOSE_DELIMITED``)."""
        if cycle.scope.get("http_version") == "1.0":
            cycle.__class__ = CloseDelimited
            extensions = cycle.scope.setdefault("extensions", {})
            extensions[CLOSE_DELIMITED] = {}
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        """uvicorn's, but an idle connection's keep-alive timeout is kept by the
        connection's one timer (``_check_deadlines``), not a timer made per reply."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._headers_since is None:  # no next request begun: idle from now
            self._idle_since = self.loop.time()
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self._period(), self._check_deadlines)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn's parser refused: the contract's JSON in its path's error
        shape (the target the parser read whole: ``on_url``; none before it), then the
        connection closes (what follows cannot be framed)."""
        error = InvalidRequest(msg, code="invalid_http_request")
        body = surface(target_path(getattr(self, "url", b""))).error_body(error)
        head = [STATUS_LINE[error.status]]
        defaults = self.server_state.default_headers  # date, server
        head.extend(name + b": " + value + b"\r\n" for name, value in defaults)
        head.append(b"content-type: application/json\r\n")
        head.append(f"{HEADER}: {new_request_id()}\r\n".encode())
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _awaiting_headers(self) -> None:
        if self._headers_since is None:
            self._headers_since = self.loop.time()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                min(_timeout(), self._period()), self._check_deadlines
            )

    def _period(self) -> float:
        """The longest the connection's timer waits before it looks again: at most the
        keep-alive timeout, so that an idle connection, whenever its idleness began, is
        found before its keep-alive has passed and closed right on time."""
        return max(self.timeout_keep_alive, _SHORTEST_PERIOD)

    def _check_deadlines(self) -> None:
        self._header_timer = None
        served = self.cycle is None or self.cycle.response_complete  # none being served
        if self._headers_since is not None:
            left = self._headers_since + _timeout() - self.loop.time()
        elif self._body_since is not None:
            left = self._body_since + _body_timeout() - self.loop.time()
            if left <= 0 and not served:  # the endpoint is reading it: its 408 comes
                left = _body_timeout()
        elif self._idle_since is not None:  # uvicorn's keep-alive timeout
            left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        else:
            return  # nothing awaited: the next request arms the timer again
        if left > 0:
            self._header_timer = self.loop.call_later(
                min(left, self._period()), self._check_deadlines
            )
        elif served:
            self.transport.close()


class CloseDelimited(RequestResponseCycle):
    """uvicorn's request cycle for an HTTP/1.0 request: a reply with no
    ``content-length`` (a stream) is sent as it comes, without the chunked encoding a
    1.0 client cannot read, and ends when the connection closes (RFC 9112 6.3: a
    close-delimited body). A reply with a length is uvicorn's (and, as uvicorn does for
    1.0, closes its connection after it)."""

    _until_close = False

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started:
            if message["type"] == "http.response.start" and not _framed(message):
                self._until_close = True
                self.keep_alive = False  # uvicorn says `connection: close`
                self.chunked_encoding = False  # and no transfer-encoding
        elif self._until_close and message["type"] == "http.response.body":
            # uvicorn counts a body against its length: this part's is the length.
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


def _framed(start: HTTPResponseStartEvent) -> bool:
    """Whether a reply's head gives its body's length."""
    return any(name.lower() == b"content-length" for name, _ in start.get("headers", ()))


def target_path(target: bytes) -> str:
    """The path of a request target (origin or absolute form), decoded as uvicorn decodes
    it for routing; "" when there is none (the parser failed before it, or it is no URL)."""
    if not target:
        return ""
    try:
        path = httptools.parse_url(target).path
    except httptools.HttpParserInvalidURLError:
        return ""
    return unquote(path.decode("latin-1")) if path else ""


@functools.cache
def _timeout() -> float:
    """Read once per process (the CLI sets it before the server starts)."""
    return float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT)


@functools.cache
def _body_timeout() -> float:
    """Read once per process (the CLI sets it before the server starts)."""
    return float(os.environ.get(BODY_TIMEOUT_ENV) or DEFAULT_BODY_TIMEOUT)
