"""The proxy's HTTP/1.1 protocol: forwarding replies written without ASGI messages.

uvicorn runs every request as an ASGI app: the reply goes out as two messages, each
checked header by header, and as two socket writes (the head, then the body). On a
loopback or LAN hop each write wakes the client, so the second one costs a wake-up
more per request, and at one connection the added latency is mostly such hops
(docs/performance.md). Here a POST to a forwarding endpoint runs the endpoint directly
on uvicorn's request cycle (still under its ``run_asgi``): its body is read through
the cycle, and a buffered reply goes out as one block in one write. Everything else
(the admin API, oversized headers, streamed replies, which pass through the cycle's own
``send``) takes the ASGI path as before; so does every request under another ASGI
server.

What uvicorn's ``send`` does for a reply, this does too: the server's default headers
(``date``), ``content-length``, ``connection: close`` when the connection ends, header
names lower-cased and values checked for control characters, the cycle marked complete
and its next pipelined request started. uvicorn's ``run_asgi`` still runs the endpoint,
so an error before the reply goes out answers 500 as for any app.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from proxy.api.forwarding import ForwardingEndpoint, HotPathRouter, send_reply
from proxy.api.protocol import HeaderTimeoutProtocol
from proxy.call import Reply

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application

__all__ = ["DirectReplyProtocol", "write_reply"]

# Every byte a header line may hold except CR and LF (uvicorn refuses control characters
# in a value, tab aside): deleting these from a head leaves only its line ends.
_PLAIN = bytes(b for b in range(256) if 32 <= b != 127) + b"\t"


class DirectReplyProtocol(HeaderTimeoutProtocol):
    """uvicorn's HTTP/1.1 protocol (with the header timeout) whose request cycle runs a POST
    to a forwarding endpoint directly (``_serve``); all else goes to the ASGI app."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        scope = cast(Scope, cycle.scope)
        endpoint = app.forwarding(scope) if isinstance(app, HotPathRouter) else None
        if endpoint is not None:
            # Still run by uvicorn's run_asgi: an error before the reply answers 500.
            app = cast("ASGI3Application", partial(_serve, endpoint, cycle, self))
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
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """``endpoint`` as the app of ``cycle``, its reply written by ``write_reply``."""
    await endpoint.serve(
        scope["headers"],
        receive,
        partial(write_reply, cycle),
        arrived=not cycle.more_body,
        watch_departure=partial(protocol.watch_departure, cycle),
    )


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
