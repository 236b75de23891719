"""One pipelined connection to a single Redis for the limiter's batches (batch.py).

Every batch is written the moment it is handed over and its replies are matched in
order as they arrive: the connection is multiplexed, never checked out of a pool, and
costs no task, no per-command timeout and no per-reply parse call (hiredis's reader
parses whatever has arrived in one go). Once the limiter has connected (its first call
goes through redis-py, which also tells a cluster from a single Redis), every call of a
single Redis over TCP or a unix socket travels here; clusters and TLS stay with redis-py.

A batch that gets no complete answer within ``timeout`` breaks the connection: every
batch still waiting fails (``TimeoutError``; ``ConnectionError`` when the connection is
lost) and the next one reconnects. Late replies can thus never be taken for another
batch's. Error replies come back as exceptions in the results (``NoScriptError`` for
NOSCRIPT, else ``ResponseError``), like redis-py's ``execute(raise_on_error=False)``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from functools import partial
from typing import Any

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import NoScriptError, ResponseError

from proxy.limiter.redis.batch import Deliver

__all__ = ["Command", "PipelinedConnection", "supports"]

Command = Sequence[str | bytes | int]


def supports(url: str) -> bool:
    """Plain TCP and unix sockets; TLS stays with redis-py."""
    return url.startswith(("redis://", "unix://"))


class _Batch:
    __slots__ = ("deliver", "replies", "size", "timer")

    def __init__(self, deliver: Deliver, size: int) -> None:
        self.deliver = deliver
        self.size = size
        self.replies: list[Any] = []
        self.timer: asyncio.TimerHandle | None = None


class PipelinedConnection:
    def __init__(self, url: str, *, connect_timeout: float, timeout: float) -> None:
        if not supports(url):
            raise ValueError("only redis:// and unix:// URLs")
        self._options = parse_url(url)
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._transport: asyncio.Transport | None = None
        self._waiting: collections.deque[_Batch] = collections.deque()
        self._connecting = asyncio.Lock()

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """The replies to ``commands``, sent in one write; raises ``ConnectionError``
        (or ``TimeoutError``) when the connection fails or stays silent too long."""
        transport = self._transport
        if transport is None or transport.is_closing():
            transport = await self._connect()
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._send(transport, commands, partial(_settle, future))
        return await future

    def send(self, commands: Sequence[Command], deliver: Deliver) -> bool:
        """Send ``commands`` now if connected (else False, and nothing is sent);
        ``deliver`` gets the replies, or the failure, the moment they are known."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        self._send(transport, commands, deliver)
        return True

    def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._fail_all(ConnectionError("connection closed"))

    # -- plumbing --------------------------------------------------------------------

    def _send(
        self, transport: asyncio.Transport, commands: Sequence[Command], deliver: Deliver
    ) -> None:
        batch = _Batch(deliver, len(commands))
        batch.timer = asyncio.get_running_loop().call_later(self._timeout, self._expire, batch)
        self._waiting.append(batch)
        # (hiredis's stub types pack_command's argument as a 1-tuple)
        transport.write(b"".join([hiredis.pack_command(tuple(c)) for c in commands]))  # type: ignore[arg-type]

    async def _connect(self) -> asyncio.Transport:
        async with self._connecting:
            if self._transport is not None and not self._transport.is_closing():
                return self._transport
            loop = asyncio.get_running_loop()
            options = self._options
            async with asyncio.timeout(self._connect_timeout):
                if "path" in options:
                    transport, _ = await loop.create_unix_connection(
                        lambda: _Protocol(self), options["path"]
                    )
                else:
                    transport, _ = await loop.create_connection(
                        lambda: _Protocol(self),
                        options.get("host", "localhost"),
                        options.get("port", 6379),
                    )
            self._transport = transport
            handshake: list[Command] = []
            if options.get("password"):
                user = options.get("username")
                handshake.append(
                    ("AUTH", user, options["password"]) if user else ("AUTH", options["password"])
                )
            if options.get("db"):
                handshake.append(("SELECT", int(options["db"])))
            if handshake:
                ready: asyncio.Future[list[Any]] = loop.create_future()
                self._send(transport, handshake, partial(_settle, ready))
                for reply in await ready:
                    if isinstance(reply, Exception):
                        self.close()
                        raise ConnectionError(f"redis handshake failed: {reply}")
            return transport

    def _received(self, transport: asyncio.BaseTransport, replies: list[Any]) -> None:
        if transport is not self._transport:
            return  # a connection given up on: its replies belong to nobody
        for reply in replies:
            if not self._waiting:
                self._broken(ConnectionError("redis sent a reply nobody asked for"))
                return
            batch = self._waiting[0]
            if isinstance(reply, hiredis.ReplyError):
                message = str(reply)
                is_noscript = message.startswith("NOSCRIPT")
                reply = NoScriptError(message) if is_noscript else ResponseError(message)
            batch.replies.append(reply)
            if len(batch.replies) == batch.size:
                self._waiting.popleft()
                if batch.timer is not None:
                    batch.timer.cancel()
                batch.deliver(batch.replies)

    def _expire(self, batch: _Batch) -> None:
        if batch in self._waiting:
            self._broken(TimeoutError(f"no reply from redis within {self._timeout} s"))

    def _broken(self, error: Exception) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        self._fail_all(error)

    def _lost(self, transport: asyncio.BaseTransport, exc: Exception | None) -> None:
        if self._transport is transport:
            self._transport = None
            self._fail_all(
                ConnectionError(f"redis connection lost: {exc or 'closed by the server'}")
            )

    def _fail_all(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, collections.deque()
        for batch in waiting:
            if batch.timer is not None:
                batch.timer.cancel()
            batch.deliver(error)


def _settle(future: asyncio.Future[list[Any]], outcome: list[Any] | BaseException) -> None:
    if future.done():
        return  # its caller gave up meanwhile
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class _Protocol(asyncio.Protocol):
    def __init__(self, connection: PipelinedConnection) -> None:
        self._connection = connection
        self._transport: asyncio.BaseTransport | None = None
        self._reader = hiredis.Reader(encoding="utf-8")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._reader.feed(data)
        replies: list[Any] = []
        try:
            while (reply := self._reader.gets()) is not False:
                replies.append(reply)
        except hiredis.ProtocolError as exc:
            self._connection._received(self._transport, replies)
            self._connection._broken(ConnectionError(f"redis protocol error: {exc}"))
            return
        self._connection._received(self._transport, replies)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._connection._lost(self._transport, exc)
