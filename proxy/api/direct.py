"""The proxy's HTTP/1.1 protocol: forwarding requests served without the ASGI app.

uvicorn runs every request as an ASGI app: a scope dict made as the request begins, a
request cycle, a task around ``run_asgi``, messages in and out, a keep-alive timer made
and cancelled per reply, and the reply as two socket writes (the head, then the body).
On a loopback or LAN hop each write wakes the client, and on the proxy's hot path the
rest costs about as much as the proxy's own work on a forwarding POST's headers
(docs/performance.md, "The HTTP protocol's own cost"). Here:

- A POST whose target is exactly a forwarding path (no query, no trailing slash,
  nothing encoded; nothing unanswered before it on the connection; no upgrade) is
  served by ``_serve_direct``: no ASGI scope, a request cycle made from the protocol's
  state at once (``_DirectCycle``), the endpoint run in the request's task, its body
  handed over whole when it has arrived (else read through the cycle, under the body
  timeout), failures ending as under ``run_asgi`` (logged; a 500 if nothing went out).
- Any other forwarding POST (``/v1/chat/completions/``, a query string, a pipelined
  request) gets uvicorn's scope and cycle, and runs the same endpoint on that cycle
  under ``run_asgi`` (``_start_asgi_task``). Everything else (the admin API, oversized
  headers) goes to the ASGI app, as does every request under another ASGI server.
- Either way a buffered reply goes out as one block in one write (``write_reply``); a
  streamed one through the cycle's own ASGI ``send`` (to an HTTP/1.0 client, unchunked
  and ended by closing the connection: ``protocol.CloseDelimited``).

What uvicorn's ``send`` does for a reply, this does too: the server's default headers
(``date``), ``content-length``, ``connection: close`` when the connection ends, header
names lower-cased and values checked for control characters, the cycle marked complete
and its next pipelined request started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from proxy.api.forwarding import ForwardingEndpoint, HotPathRouter, send_reply, target_of
from proxy.api.protocol import CloseDelimited, HeaderTimeoutProtocol
from proxy.request.call import Reply
from proxy.shapes.base import AT_PATH, RequestTarget

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application, HTTPScope

__all__ = ["DirectReplyProtocol", "write_reply"]

# Every byte a header line may hold except CR and LF (uvicorn refuses control characters
# in a value, tab aside): deleting these from a head leaves only its line ends.
_PLAIN = bytes(b for b in range(256) if 32 <= b != 127) + b"\t"


# The scope of a request served without the ASGI app: uvicorn's cycle reads its method only.
_DIRECT_SCOPE = cast("HTTPScope", {"type": "http", "method": "POST"})


class DirectReplyProtocol(HeaderTimeoutProtocol):
    """uvicorn's HTTP/1.1 protocol (with the header timeout) that serves a POST to a
    forwarding endpoint itself (``_serve_direct``); all else goes to the ASGI app."""

    # The parser's callbacks, each one call deep: they run for every request. They keep
    # what uvicorn's keep (the target, the headers lower-cased, Expect: 100-continue) but
    # make no ASGI scope until a request turns out to need one (_asgi_scope).
    def on_message_begin(self) -> None:
        if self._continuing:
            return
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._awaiting_headers()

    def on_url(self, url: bytes) -> None:
        if not self._continuing:
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._continuing:
            return
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        endpoint = self._direct_endpoint()
        if endpoint is None:
            if not self._continuing:
                self._asgi_scope()
            super().on_headers_complete()
            return
        self._headers_arrived()
        parser = self.parser
        if parser.get_http_version() != "1.0":
            cycle: _DirectCycle = _DirectCycle(self, parser.should_keep_alive())
        else:  # a stream unchunked, closed at its end; its connection closed after
            cycle = _DirectCycle10(self, False)
        self.cycle = cycle
        task = self.loop.create_task(self._serve_direct(endpoint, cycle, self.headers))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _direct_endpoint(self) -> ForwardingEndpoint | None:
        """The forwarding endpoint this request goes to with no ASGI app around it: a POST
        whose target is exactly a forwarding path, nothing before it on the connection
        still unanswered, no upgrade asked. None: the ASGI path (which still serves a
        forwarding request without ASGI messages: ``_start_asgi_task``)."""
        app = self.app
        if (
            self._continuing
            or not isinstance(app, HotPathRouter)
            or self.access_log
            or self.limit_concurrency is not None
            or self.config.reset_contextvars
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.parser.get_method() != b"POST"
            or self.parser.should_upgrade()
        ):
            return None
        return app.direct(self.url, self.headers)

    def _asgi_scope(self) -> None:
        """uvicorn's scope for the request whose head was just read (uvicorn makes it as
        a request begins, and its headers go into it as they come)."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)
        self.url, self.expect_100_continue = url, expect
        self.headers = self.scope["headers"] = headers

    async def _serve_direct(
        self,
        endpoint: ForwardingEndpoint,
        cycle: _DirectCycle,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """``endpoint`` on ``cycle``; a failure ends as under uvicorn's ``run_asgi``:
        logged, and a 500 if no reply has gone out yet, else the connection closed."""
        try:
            await _serve(endpoint, cycle, self, headers)
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not cycle.response_started:
                await cycle.send_500_response()
            else:
                self.transport.close()
        else:
            if not cycle.response_started and not cycle.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await cycle.send_500_response()
            elif not cycle.response_complete and not cycle.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            cycle.on_response = _nothing

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        scope = cast(Scope, cycle.scope)
        endpoint = app.forwarding(scope) if isinstance(app, HotPathRouter) else None
        if endpoint is not None:
            # Still run by uvicorn's run_asgi: an error before the reply answers 500.
            app = cast("ASGI3Application", partial(_serve_asgi, endpoint, cycle, self))
        super()._start_asgi_task(cycle, app)

    # Whoever waits for this connection's client to leave (the request running on it,
    # during its upstream call): told by connection_lost, no task watching.
    _departure: dict[Callable[[], None], None] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        waiting, self._departure = self._departure, None
        for callback in waiting or ():
            callback()

    def watch_departure(
        self, cycle: RequestResponseCycle, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``callback`` once the client of ``cycle`` has gone; returns the undo."""
        if cycle.disconnected:
            return self.loop.call_soon(callback).cancel
        if self._departure is None:
            self._departure = {}
        waiting = self._departure
        waiting[callback] = None
        return partial(waiting.pop, callback, None)


async def _serve(
    endpoint: ForwardingEndpoint,
    cycle: RequestResponseCycle,
    protocol: DirectReplyProtocol,
    headers: list[tuple[bytes, bytes]],
    target: RequestTarget = AT_PATH,
) -> None:
    """``endpoint`` on ``cycle``: its body through the cycle's ``receive`` (handed over
    whole if it has arrived), its reply written by ``write_reply``; ``target``: what its
    URL says (none for an exact path: ``AT_PATH``)."""
    body = None
    if not cycle.more_body:  # all of it is here: handed over, no receive()
        body, cycle.body = bytes(cycle.body), bytearray()
    await endpoint.serve(
        headers,
        cast(Receive, cycle.receive),
        partial(write_reply, cycle),
        body=body,
        watch_departure=partial(protocol.watch_departure, cycle),
        target=target,
    )


async def _serve_asgi(
    endpoint: ForwardingEndpoint,
    cycle: RequestResponseCycle,
    protocol: DirectReplyProtocol,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """``_serve`` as the ASGI app ``run_asgi`` calls (its ``receive`` is the cycle's)."""
    await _serve(endpoint, cycle, protocol, scope["headers"], target_of(scope))


class _DirectCycle(RequestResponseCycle):
    """uvicorn's request cycle for a request ``DirectReplyProtocol`` serves itself: made
    from the protocol's state at once (its ``receive`` and ``send`` as uvicorn's: a body
    that is still arriving, a streamed reply)."""

    def __init__(self, protocol: DirectReplyProtocol, keep_alive: bool) -> None:
        self.scope = _DIRECT_SCOPE
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.logger = protocol.logger
        self.access_logger = protocol.access_logger
        self.access_log = False
        self.default_headers = protocol.server_state.default_headers
        self.message_event = asyncio.Event()
        self.on_response = protocol.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding = None
        self.expected_content_length = 0


class _DirectCycle10(_DirectCycle, CloseDelimited):
    """``_DirectCycle`` for an HTTP/1.0 request: a streamed reply unchunked, ended by
    closing the connection (``protocol.CloseDelimited``)."""


def _nothing() -> None:
    pass


async def write_reply(cycle: RequestResponseCycle, reply: Reply) -> None:
    """A buffered reply as one write; a streamed one through the cycle's ASGI ``send``."""
    if reply.stream is not None:
        await send_reply(reply, cast(Receive, cycle.receive), cast(Send, cycle.send))
        return
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    if reply.headers.pop("connection", None) == "close":  # e.g. a body that stalled: 408
        cycle.keep_alive = False
    head = _head(cycle, reply)  # raises (an answer 500) before anything is written
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.transport.write(head + reply.body)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def _head(cycle: RequestResponseCycle, reply: Reply) -> bytes:
    """The status line and headers. The pipeline's replies never carry framing headers
    (``connection``, ``content-length``, ``transfer-encoding``: upstream/headers.py)."""
    lines = [f"{name.lower()}: {value}\r\n" for name, value in reply.headers.items()]
    if not cycle.keep_alive:
        lines.append("connection: close\r\n")
    lines.append(f"content-length: {len(reply.body)}\r\n\r\n")
    block = "".join(lines).encode("latin-1")
    if block.translate(None, _PLAIN) != b"\r\n" * (len(lines) + 1):  # a CR, LF or control
        raise RuntimeError("Invalid HTTP header value.")  # character in a name or value
    default = b"".join(name + b": " + value + b"\r\n" for name, value in cycle.default_headers)
    return STATUS_LINE[reply.status] + default + block
