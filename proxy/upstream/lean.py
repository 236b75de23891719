"""The lean upstream transport: ``http://`` and ``https://`` upstreams, no egress proxy.

asyncio's protocol API and httptools' parser (the C parser uvicorn uses) with a
keep-alive pool per origin, behind the same interface as the general client
(``client.py``): ``httpx.Request`` in, ``httpx.Response`` out, the headers also as a dict
(``HEADER_MAP``), a buffered body handed over in one ``read()`` (read on without pause,
up to the bound it is read with), a streamed one chunk by chunk as it arrives (reading
paused while its consumer lags). It does what a proxy's upstream call needs and nothing else: one
``transport.write`` per request, no cookies, redirects, decompression or per-request
options, no task per request.

TLS is asyncio's (``create_connection(ssl=...)``) with the deployment's context
(``catalog.Egress.ssl``) or, without one, a default context made once (system trust,
ALPN ``http/1.1``, as aiohttp's default); the handshake counts within the connect timeout.

Failures raise httpx's exceptions with a plain cause that ``errors.py`` reads as it reads
aiohttp's: a refused port, DNS, a certificate not verified or another failed handshake, a
reset, a timeout connecting (``ConnectError`` / ``ConnectTimeout`` from the ``OSError`` /
``ssl.SSLError`` / ``TimeoutError``), a timeout reading (``ReadTimeout``), a broken or
short answer (``RemoteProtocolError`` / ``ReadError``).

A connection goes back to the pool only after a complete answer the upstream lets it
keep, and idle connections expire before an upstream's keep-alive timeout can close them
under a request: plain ones after ``IDLE_EXPIRY`` (under every usual keep-alive timeout),
TLS ones, whose handshake costs far more than a connect, after ``TLS_IDLE_EXPIRY`` (under
uvicorn's 5 s), or a second before the timeout the upstream announces (``Keep-Alive:
timeout=N``, at most ``TLS_MAX_EXPIRY``); an upstream seen closing an idle TLS connection
sooner brings its origin's expiry down below that, to ``IDLE_EXPIRY`` at least. A
connection the upstream closed while idle is never handed out (``eof_received``).
Each pool is per (scheme, host, port, TLS context): deployments with different TLS
settings never share a connection. Egress proxies keep the general client
(``client.UpstreamTransport`` chooses per request).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import math
import socket
import ssl
import sys
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

import httptools
import httpx

from proxy.upstream.interface import (
    HEADER_MAP,
    AnswerTooLarge,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStream,
)

__all__ = ["IDLE_EXPIRY", "TLS_IDLE_EXPIRY", "LeanTransport"]

IDLE_EXPIRY = 1.5  # seconds an idle connection is kept: under every usual keep-alive timeout
TLS_IDLE_EXPIRY = 4.0  # the same for TLS, unless the upstream says more (or shows less)
TLS_MAX_EXPIRY = 60.0  # at most, whatever the upstream announces
EXPIRY_MARGIN = 1.0  # seconds kept clear of an upstream's keep-alive timeout
MAX_IDLE = 256  # idle connections kept per origin
MAX_TARGETS = 4096  # request targets kept parsed (a stored response's URL has its id)
DNS_TTL = 300.0  # seconds a host name's addresses are reused (as the general client does)
# A stream's unread bytes above this pause reading from the upstream (backpressure);
# reading resumes once the consumer has taken them.
HIGH_WATER = 256 * 1024

_HTTP11 = {"http_version": b"HTTP/1.1"}
_CRLF = b"\r\n"


class _Exchange:
    """One request's answer, as the connection parses it."""

    __slots__ = (
        "body_until_close",
        "buffered",
        "done",
        "error",
        "headers",
        "limit",
        "parts",
        "status",
        "waiter",
    )

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: deque[bytes] = deque()
        self.buffered = 0  # bytes in ``parts``
        self.done = False  # the whole answer is in
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.body_until_close = False  # no length, not chunked: the body ends at EOF
        # Read whole (``LeanStream.read``): never paused, failed past this many bytes
        # (None: streamed, reading pauses above ``HIGH_WATER`` unread bytes).
        self.limit: int | None = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an upstream; the parser's callbacks land here."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.keep = True  # may carry another request after this answer
        self.paused = False
        self.idle_since = 0.0
        self.read_timeout: float | None = None
        self.last_data = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.headers_at = False  # the current answer's head is in
        self.announce = pool.tls  # the first answer's Keep-Alive header is still to be read

    # --- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # nothing asked: an upstream talking out of turn
            self.close()
            return
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("The upstream switched protocols."))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"Invalid HTTP answer: {exc}"))

    def eof_received(self) -> bool | None:
        self.keep = False
        exchange = self.exchange
        if exchange is None:
            self.pool.dropped(self)  # the upstream closed it while it was idle
        if exchange is not None and exchange.body_until_close and self.headers_at:
            self.on_message_complete()  # the body was "until close": it is complete
        self.closed = self.exchange is None  # idle: never handed out again
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and self.exchange is None:
            self.pool.dropped(self)  # closed or reset by the upstream while idle
        self.closed = True
        self._cancel_timer()
        exchange = self.exchange
        if exchange is not None and not exchange.done:
            if exchange.body_until_close and self.headers_at and exc is None:
                self.on_message_complete()
            elif isinstance(exc, ConnectionResetError) and not self.headers_at:
                # Reset before an answer: what the general client calls a reset.
                self._fail(httpx.ReadError("The connection was reset."), exc)
            elif self.headers_at:
                self._fail(httpx.ReadError("The upstream closed the connection mid-answer."))
            else:
                self._fail(httpx.RemoteProtocolError("The upstream closed the connection."))
        self.pool.forget(self)

    # --- the parser's callbacks -----------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.headers.append((name, value))

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the real one follows
            exchange.headers = []
            return
        exchange.status = status
        self.headers_at = True
        framed = False
        for name, _ in exchange.headers:
            lowered = name.lower()
            if lowered == b"content-length" or lowered == b"transfer-encoding":
                framed = True
                break
        exchange.body_until_close = not framed
        if exchange.body_until_close:
            self.keep = False
        if self.announce:
            self.announce = False
            self.pool.announced(exchange.headers)
        self._wake(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.parts.append(body)
        exchange.buffered += len(body)
        limit = exchange.limit
        if limit is not None:  # read whole: only its bound stops it, its end wakes its reader
            if exchange.buffered > limit:
                self._fail(AnswerTooLarge(limit))
            return
        if exchange.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake(exchange)

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is None or exchange.done or not self.headers_at:
            return  # (no head yet: the end of an interim answer, 1xx; the real one follows)
        exchange.done = True
        self.exchange = None
        self.headers_at = False
        # The read timer is left to run out (it finds nobody waiting): made and cancelled
        # per answer it cost 3.9 us a request; one timer now serves many exchanges.
        if not self.parser.should_keep_alive():
            self.keep = False
        self._wake(exchange)
        self.pool.release(self)

    # --- used by the transport and the stream ----------------------------------------

    def send(self, payload: bytes, exchange: _Exchange, read_timeout: float | None) -> None:
        assert self.transport is not None
        self.exchange = exchange
        self.read_timeout = read_timeout
        self.last_data = self.loop.time()
        self.transport.write(payload)

    async def wait(self, exchange: _Exchange) -> None:
        """Until something new about ``exchange`` (its head, a chunk, its end, a failure)."""
        waiter = exchange.waiter = self.loop.create_future()
        self.last_data = self.loop.time()  # the read timeout counts from here, or new data
        if self.read_timeout is not None:
            due, timer = self.last_data + self.read_timeout, self.timer
            if timer is None or timer.when() > due:  # none, or one for a longer timeout
                if timer is not None:
                    timer.cancel()
                self.timer = self.loop.call_at(due, self._on_timer)
        try:
            await waiter
        finally:
            exchange.waiter = None

    def taken(self, exchange: _Exchange, size: int) -> None:
        """The consumer took ``size`` bytes: resume reading below the high water mark."""
        exchange.buffered -= size
        if self.paused and self.exchange is exchange and exchange.buffered <= HIGH_WATER // 4:
            self.resume()

    def read_whole(self, exchange: _Exchange, limit: int | None) -> None:
        """``exchange``, still coming in, is to be read whole: reading never pauses for
        it again (backpressure would wait for a consumer that takes the body only at its
        end) and fails with ``AnswerTooLarge`` past ``limit`` bytes (None: no bound)."""
        exchange.limit = limit if limit is not None else sys.maxsize
        if self.exchange is not exchange:
            return
        if exchange.buffered > exchange.limit:
            self._fail(AnswerTooLarge(exchange.limit))
        else:
            self.resume()

    def resume(self) -> None:
        """Read again if reading was paused (backpressure) and the connection is open."""
        if self.paused and not self.closed:
            self.paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel_timer()
            if self.transport is not None:
                self.transport.close()
        self.keep = False

    # --- internals ------------------------------------------------------------------

    def _wake(self, exchange: _Exchange) -> None:
        waiter = exchange.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception, cause: BaseException | None = None) -> None:
        exchange = self.exchange
        if exchange is not None and exchange.error is None:
            error.__cause__ = cause
            exchange.error = error
            self._wake(exchange)
        self.close()

    def _on_timer(self) -> None:
        self.timer = None
        exchange = self.exchange
        if exchange is None or exchange.waiter is None or self.read_timeout is None:
            return  # nobody waits: the clock starts again with the next wait
        due = self.last_data + self.read_timeout
        if self.loop.time() < due:  # data came meanwhile
            self.timer = self.loop.call_at(due, self._on_timer)
            return
        self._fail(httpx.ReadTimeout("Timed out reading from the upstream."), TimeoutError())

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Pool:
    """The connections to one origin: idle ones (newest last) and a bound on open ones.
    ``context``: TLS with it (``server_hostname`` the name the certificate must bear)."""

    def __init__(
        self,
        host: str,
        port: int,
        limit: int,
        context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.limit = limit
        self.context = context
        self.server_hostname = server_hostname if context is not None else None
        self.tls = context is not None
        # Seconds an idle connection is kept; the ceiling comes down when the upstream
        # is seen closing idle connections sooner.
        self.expiry = TLS_IDLE_EXPIRY if self.tls else IDLE_EXPIRY
        self.ceiling = math.inf
        self.open = 0
        self.idle: list[_Connection] = []
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.sweeper: asyncio.TimerHandle | None = None
        self.addresses: list[tuple[Any, ...]] = []
        self.resolved_at = -DNS_TTL
        self.literal = _is_ip(host)

    async def acquire(
        self, connect_timeout: float | None, pool_timeout: float | None
    ) -> _Connection:
        idle = self.idle
        while idle:
            connection = idle.pop()
            if connection.closed or connection.transport is None:
                continue
            if connection.transport.is_closing():
                connection.close()
                continue
            if self.loop.time() - connection.idle_since < self.expiry:
                return connection
            connection.close()  # too old to trust: the upstream may be closing it
        while self.open >= self.limit:
            await self._slot(pool_timeout)
            if self.idle:
                return await self.acquire(connect_timeout, pool_timeout)
        self.open += 1
        try:
            return await self._connect(connect_timeout)
        except BaseException:
            self.open -= 1
            self._hand_on()
            raise

    def release(self, connection: _Connection) -> None:
        """A complete answer: keep the connection for the next request, or close it."""
        if not connection.keep or connection.closed or len(self.idle) >= MAX_IDLE:
            connection.close()
            return
        connection.resume()
        connection.idle_since = self.loop.time()
        self.idle.append(connection)
        if self.sweeper is None:
            self.sweeper = self.loop.call_later(self.expiry, self._sweep)
        self._hand_on()

    def forget(self, connection: _Connection) -> None:
        """``connection`` is closed: its slot is free."""
        self.open -= 1
        if connection in self.idle:
            self.idle.remove(connection)
        self._hand_on()

    def announced(self, headers: list[tuple[bytes, bytes]]) -> None:
        """A TLS connection's first answer: the upstream's ``Keep-Alive: timeout=N``, if
        any, sets how long idle connections are kept (a margin under it)."""
        for name, value in headers:
            if name.lower() == b"keep-alive":
                timeout = _keep_alive_timeout(value)
                if timeout is not None:
                    keep = max(timeout - EXPIRY_MARGIN, timeout / 2)
                    self.expiry = min(keep, TLS_MAX_EXPIRY, self.ceiling)
                return

    def dropped(self, connection: _Connection) -> None:
        """The upstream closed ``connection`` while it was idle: if sooner than the
        expiry, the upstream keeps idle connections for less (TLS pools: down to the
        plain expiry at least, so one restart does not cost every later handshake)."""
        if connection not in self.idle:
            return
        age = self.loop.time() - connection.idle_since
        if age < self.expiry:
            self.ceiling = min(self.ceiling, max(age - EXPIRY_MARGIN, IDLE_EXPIRY))
            self.expiry = min(self.expiry, self.ceiling)

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None

    async def _slot(self, wait_for: float | None) -> None:
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, wait_for)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("No connection became free in time.") from exc
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def _hand_on(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        self.sweeper = None
        cutoff = self.loop.time() - self.expiry
        for connection in [c for c in self.idle if c.idle_since <= cutoff]:
            connection.close()  # forget() takes it off the list
        if self.idle:
            self.sweeper = self.loop.call_later(self.expiry, self._sweep)

    async def _connect(self, within: float | None) -> _Connection:
        try:
            async with asyncio.timeout(within):
                addresses = await self._resolve()
                error: OSError | None = None
                for family, _, proto, _, address in addresses:
                    try:
                        return await self._open(family, proto, address)
                    except ssl.SSLError:
                        raise  # connected, the handshake failed: another address would too
                    except OSError as exc:
                        error = exc  # the next address, if any
                assert error is not None
                raise error
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("Timed out connecting to the upstream.") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"Could not connect to the upstream: {exc}") from exc

    async def _open(self, family: int, proto: int, address: tuple[Any, ...]) -> _Connection:
        connection = _Connection(self)
        await self.loop.create_connection(
            lambda: connection,
            address[0],
            address[1],
            family=family,
            proto=proto,
            ssl=self.context,
            server_hostname=self.server_hostname,
        )
        return connection

    async def _resolve(self) -> list[tuple[Any, ...]]:
        if self.literal:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 0, "", (self.host, self.port))]
        now = self.loop.time()
        if now - self.resolved_at >= DNS_TTL or not self.addresses:
            self.addresses = await self.loop.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM
            )
            self.resolved_at = now
        return self.addresses


class LeanStream(UpstreamStream):
    """An answer's body: chunk by chunk as it arrives, or whole in one ``read()``."""

    __slots__ = ("_connection", "_exchange")

    def __init__(self, connection: _Connection, exchange: _Exchange) -> None:
        self._connection = connection
        self._exchange = exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        exchange, connection = self._exchange, self._connection
        while True:
            if exchange.parts:
                chunk = exchange.parts.popleft()
                connection.taken(exchange, len(chunk))
                yield chunk
                continue
            if exchange.done:
                return
            if exchange.error is not None:
                raise exchange.error
            await connection.wait(exchange)

    async def read(self, limit: int | None = None) -> bytes:
        exchange, connection = self._exchange, self._connection
        if not exchange.done:
            connection.read_whole(exchange, limit)
        while not exchange.done and exchange.error is None:
            await connection.wait(exchange)
        if exchange.error is not None:
            raise exchange.error
        if limit is not None and exchange.buffered > limit:
            raise AnswerTooLarge(limit)
        parts = exchange.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        exchange.buffered = 0
        return body

    async def aclose(self) -> None:
        exchange = self._exchange
        if not exchange.done:  # unread: the connection cannot carry another request
            exchange.done = True
            if self._connection.exchange is exchange:
                self._connection.close()


class _Target:
    """A parsed upstream URL: its pool and the first bytes of every request to it."""

    __slots__ = ("pool", "prefix")

    def __init__(self, method: str, url: httpx.URL, pool: _Pool) -> None:
        self.pool = pool
        host = url.raw_host
        if url.port is not None:
            host += b":%d" % url.port
        self.prefix = b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode(), url.raw_path, host)


class LeanTransport(httpx.AsyncBaseTransport):
    """Upstream calls without an egress proxy (``client.UpstreamTransport`` hands them
    over)."""

    def __init__(self, max_connections: int = 1000) -> None:
        self._limit = max_connections
        self._pools: dict[tuple[str, str, int, ssl.SSLContext | None], _Pool] = {}
        self._targets: dict[tuple[str, str, ssl.SSLContext | None], _Target] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.forward(request, str(request.url))

    async def forward(
        self, request: httpx.Request, url: str, context: ssl.SSLContext | None = None
    ) -> httpx.Response:
        """``request`` to ``url`` (its URL as text, which the caller has at hand);
        ``context``: the deployment's TLS settings for an ``https://`` URL (None: the
        system's trust store, verified)."""
        target = self._targets.get((request.method, url, context)) or self._target(
            request, url, context
        )
        head = [target.prefix]
        if isinstance(request, UpstreamRequest):  # the proxy's: its header dict as it is
            fields = [f"{name}: {value}\r\n" for name, value in request.fields.items()]
            head.append("".join(fields).encode("latin-1"))
        else:
            for name, value in request.headers.raw:
                head.append(name + b": " + value + _CRLF)
        head.append(_CRLF)
        try:
            head.append(request.content)
        except httpx.RequestNotRead:
            head.append(await request.aread())
        timeouts = request.extensions.get("timeout") or {}
        connection = await target.pool.acquire(timeouts.get("connect"), timeouts.get("pool"))
        exchange = _Exchange()
        try:
            connection.send(b"".join(head), exchange, timeouts.get("read"))
            while not exchange.status:  # until the answer's head is in
                if exchange.error is not None:
                    raise exchange.error
                await connection.wait(exchange)
        except BaseException:
            connection.close()  # a half-done exchange: never reused
            raise
        headers = exchange.headers
        header_map = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        return UpstreamResponse(
            exchange.status,
            headers,
            LeanStream(connection, exchange),
            request,
            {**_HTTP11, HEADER_MAP: header_map},
        )

    def _target(self, request: httpx.Request, url: str, context: ssl.SSLContext | None) -> _Target:
        parsed = request.url
        if parsed.scheme == "https":
            tls: ssl.SSLContext | None = context or default_context()
            port = parsed.port or 443
        elif parsed.scheme == "http":
            tls, port = None, parsed.port or 80
        else:
            raise httpx.UnsupportedProtocol(f"The lean transport does not speak {parsed.scheme}.")
        origin = (parsed.scheme, parsed.host, port, tls)
        pool = self._pools.get(origin)
        if pool is None:
            hostname = parsed.raw_host.decode("ascii")
            pool = self._pools[origin] = _Pool(parsed.host, port, self._limit, tls, hostname)
        key = (request.method, url, context)
        if len(self._targets) >= MAX_TARGETS:  # URLs with ids in them: kept bounded
            self._targets.clear()
        target = self._targets[key] = _Target(request.method, parsed, pool)
        return target

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._targets.clear()


@functools.cache
def default_context() -> ssl.SSLContext:
    """The TLS context of upstreams whose deployment brings none, made once: the system's
    trust store, verified, ALPN ``http/1.1`` (as aiohttp's default context)."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


def _keep_alive_timeout(value: bytes) -> float | None:
    """``timeout=5, max=100`` -> 5.0 (None: no usable timeout)."""
    for part in value.split(b","):
        name, _, number = part.partition(b"=")
        if name.strip().lower() == b"timeout":
            try:
                timeout = float(number.strip())
            except ValueError:
                return None
            return timeout if timeout >= 0 else None
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
