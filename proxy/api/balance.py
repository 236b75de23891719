"""Connections shared out evenly among the workers of ``serve --workers N``.

The workers accept from one listening socket. Left to the event loop, whichever worker
wakes first takes every connection waiting: a client that opens its connections at once
(an SDK's pool, a load balancer, a load generator) landed 62 of 64 on one worker, and
keep-alive connections stay where they land: with a core per worker, that worker's core
is then the whole proxy's (docs/performance.md, "Connections balanced across workers").
Here a worker accepts only while it holds at most ``SLACK`` (one) open connection more
than the least loaded of the others.

The counts live in a small file that the parent creates and every worker maps
(:class:`ConnectionTable`: one slot per worker, its pid and its open connections). A
worker that does not take a waiting connection within ``PATIENCE`` (its loop stalled, or
it died before a replacement took its slot) is not waited for.

The loop is uvicorn's custom loop (``serve --workers N`` passes :func:`new_event_loop`):
its ``create_server`` on a given socket returns a :class:`BalancedListener` instead of the
event loop's own server. One worker, or no table, serves as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import mmap
import os
import select
import socket
import ssl as ssl_module
import struct
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, Final

from proxy.worker_env import CONNECTIONS_ENV

__all__ = [
    "BalancedListener",
    "ConnectionTable",
    "create_table",
    "may_accept",
    "new_event_loop",
    "read_table",
    "remove_table",
]

logger = logging.getLogger("uvicorn.error")

# How far ahead of the least loaded worker another may take a connection: 64 connections
# opened at once land 31 to 33 on each of two workers, and a worker that serves a
# connection per request (counts moving by one all the time) rarely lets one wait.
SLACK: Final = 1
# How long a connection waits for a less loaded worker before another takes it.
PATIENCE: Final = 0.05
# How soon a worker that let a connection wait looks again.
RETRY: Final = 0.001
# After an accept fails for want of descriptors or memory: asyncio's own pause.
RESOURCE_PAUSE: Final = 1.0
_RESOURCE_ERRORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

_SLOT: Final = struct.Struct("=qq")  # pid, open connections


def may_accept(mine: int, others: Sequence[int]) -> bool:
    """Whether a worker with ``mine`` open connections takes the next one, when the other
    live workers hold ``others``: those within ``SLACK`` of the least loaded do."""
    return not others or mine <= min(others) + SLACK


def create_table(workers: int) -> str:
    """The parent's part: a fresh table for ``workers`` workers (room for their
    replacements starting beside them), exported to the workers it spawns; its path."""
    descriptor, path = tempfile.mkstemp(prefix="llmproxy-connections-")
    with os.fdopen(descriptor, "wb") as table:
        table.write(bytes(_SLOT.size * _slots(workers)))
    os.environ[CONNECTIONS_ENV] = path
    return path


def remove_table(path: str) -> None:
    """The parent's part, once its workers have stopped."""
    if os.environ.get(CONNECTIONS_ENV) == path:
        del os.environ[CONNECTIONS_ENV]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def read_table(path: str) -> list[tuple[int, int]]:
    """(pid, open connections) of every worker holding a slot in the table at ``path``."""
    with open(path, "rb") as table:
        return [(pid, count) for _, pid, count in _held(table.read())]


def _held(table: bytes | mmap.mmap) -> list[tuple[int, int, int]]:
    """(slot, pid, open connections) of every slot a worker holds."""
    return [
        (slot, pid, count) for slot, (pid, count) in enumerate(_SLOT.iter_unpack(table)) if pid != 0
    ]


def _slots(workers: int) -> int:
    return max(2 * workers, 8)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or the pid is someone else's now
        return False
    return True


class ConnectionTable:
    """This worker's slot in the shared table, and the others' counts."""

    def __init__(self, path: str, pid: int | None = None) -> None:
        self._pid = os.getpid() if pid is None else pid
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
            # Claimed under a lock: workers start together and may look at once.
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                self._slot = self._claim()
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)
        self.open = 0

    @classmethod
    def from_env(cls) -> ConnectionTable | None:
        path = os.environ.get(CONNECTIONS_ENV)
        if not path:
            return None
        try:
            return cls(path)
        except (OSError, ValueError, LookupError) as exc:
            logger.warning("Connections not balanced across workers (%s): %s", path, exc)
            return None

    def _claim(self) -> int:
        for slot in range(len(self._map) // _SLOT.size):
            pid, _ = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if pid == 0 or not _alive(pid):
                self._put(slot, self._pid, 0)
                return slot
        raise LookupError("every slot is held by a live worker")

    def _put(self, slot: int, pid: int, count: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, pid, count)

    def opened(self) -> None:
        self.open += 1
        self._put(self._slot, self._pid, self.open)

    def closed(self) -> None:
        self.open -= 1
        self._put(self._slot, self._pid, self.open)

    def others(self) -> list[tuple[int, int]]:
        """(pid, open connections) of every other worker holding a slot."""
        return [(pid, count) for slot, pid, count in _held(self._map) if slot != self._slot]

    def may_accept(self) -> bool:
        return may_accept(self.open, [count for _, count in self.others()])

    def forget_dead(self) -> None:
        """Free the slots of workers that are gone (their counts held the others back)."""
        for slot, pid, _ in _held(self._map):
            if slot != self._slot and not _alive(pid):
                # A replacement claiming it at once writes the same zeroes.
                self._put(slot, 0, 0)

    def release(self) -> None:
        with contextlib.suppress(ValueError):  # already closed
            self._put(self._slot, 0, 0)
            self._map.close()


class BalancedListener:
    """Accepts from a listening socket shared with other workers, only on this worker's
    turn (:class:`ConnectionTable`); what uvicorn uses of an ``asyncio.Server``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        table: ConnectionTable,
        ssl: ssl_module.SSLContext | None = None,
        ssl_handshake_timeout: float | None = None,
        backlog: int = 100,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = protocol_factory
        self._table = table
        self._ssl = ssl
        self._handshake_timeout = ssl_handshake_timeout
        self._reading = False
        self._serving = True
        self._retry: asyncio.TimerHandle | None = None
        self._declined_since: float | None = None  # a waiting connection left to others
        sock.setblocking(False)
        sock.listen(backlog)
        self._read()

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        self._pause()
        self._table.release()

    async def wait_closed(self) -> None:
        """uvicorn has waited for the connections already; nothing else is held."""

    def _read(self) -> None:
        if self._serving and not self._reading:
            self._loop.add_reader(self._sock.fileno(), self._accept_ready)
            self._reading = True

    def _pause(self, delay: float | None = None) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if delay is not None and self._serving:
            self._retry = self._loop.call_later(delay, self._look_again)

    def _look_again(self) -> None:
        self._retry = None
        if self._declined_since is not None and not _readable(self._sock):
            self._declined_since = None  # another worker took it
        self._read()

    def _accept_ready(self) -> None:
        if not self._table.may_accept():
            now = self._loop.time()
            if self._declined_since is None:
                self._declined_since = now
            if now - self._declined_since < PATIENCE:
                self._pause(RETRY)
                return
            # Nobody took it: a stalled or dead worker. Free the dead ones' slots, and
            # take all that waits.
            self._table.forget_dead()
            forced = True
        else:
            forced = False
        self._declined_since = None
        while self._serving:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRORS:
                    logger.error("Cannot accept a connection: %s", exc)
                    self._pause(RESOURCE_PAUSE)
                    return
                continue  # the client left while it waited (ECONNABORTED, EPROTO)
            self._serve(conn)
            if not forced and not self._table.may_accept():
                return  # called again while one waits: the turn is looked at then

    def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._table.opened()
        counted = _Counted(self._table)
        try:
            self._loop.create_task(self._connect(conn, counted))
        except RuntimeError:  # the loop is closing
            conn.close()
            counted.done()

    async def _connect(self, conn: socket.socket, counted: _Counted) -> None:
        def protocol() -> asyncio.BaseProtocol:
            made = self._factory()
            lost = made.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                try:
                    lost(exc)
                finally:
                    counted.done()

            made.connection_lost = connection_lost  # type: ignore[method-assign]
            return made

        extra: dict[str, Any] = {}
        if self._ssl is not None:
            extra["ssl_handshake_timeout"] = self._handshake_timeout
        served = False
        try:
            await self._loop.connect_accepted_socket(protocol, conn, ssl=self._ssl, **extra)
            served = True
        except (TimeoutError, OSError, ValueError, ssl_module.SSLError) as exc:
            # Gone before it was served (a failed TLS handshake, a reset): nothing to answer.
            logger.debug("Connection dropped before it was served: %r", exc)
        finally:
            if not served:  # whatever stopped it (cancelled too), its place is given back
                conn.close()
                counted.done()


class _Counted:
    """One accepted connection's place in the count, given back once."""

    __slots__ = ("_table",)

    def __init__(self, table: ConnectionTable) -> None:
        self._table: ConnectionTable | None = table

    def done(self) -> None:
        if self._table is not None:
            self._table.closed()
            self._table = None


def _readable(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


class _Balancing:
    """``create_server`` on a given socket (how uvicorn's workers serve) balanced."""

    async def create_server(  # type: ignore[no-untyped-def]
        self, protocol_factory, host=None, port=None, *, sock=None, ssl=None, backlog=100, **kw
    ):
        table = ConnectionTable.from_env() if sock is not None else None
        if table is None:
            return await super().create_server(  # type: ignore[misc]
                protocol_factory, host, port, sock=sock, ssl=ssl, backlog=backlog, **kw
            )
        return BalancedListener(
            self,  # type: ignore[arg-type]
            sock,
            protocol_factory,
            table,
            ssl=ssl,
            ssl_handshake_timeout=kw.get("ssl_handshake_timeout"),
            backlog=backlog,
        )


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's custom loop (``Config(loop="proxy.api.balance:new_event_loop")``):
    uvloop's where it is installed, else asyncio's, with a balanced ``create_server``."""
    return _loop_class()()


@functools.cache
def _loop_class() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:

        class BalancedAsyncioLoop(_Balancing, asyncio.SelectorEventLoop):
            pass

        return BalancedAsyncioLoop

    class BalancedUvloop(_Balancing, uvloop.Loop):  # type: ignore[misc]
        pass

    return BalancedUvloop
