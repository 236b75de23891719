"""A bare HTTP/1.1 upstream on 127.0.0.1 for transport tests: each test scripts what its
server sends (well-formed or broken) as a coroutine over the connection.

``RawUpstream(answer)`` serves every request on every connection by calling
``answer(conversation)`` after reading the request's head and body; the conversation
writes bytes, resets, closes (or hangs up and waits for the client to see it) or stalls.
It counts connections and keeps the requests. ``RawUpstream(answer, tls=context)``
serves HTTPS with that server context (support/tls.py); ``Greeter(data)`` sends ``data``
to every connection as soon as it is made and closes it (a TLS client's handshake meets
garbage), ``Greeter(None)`` never answers (a handshake that never completes).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Answer", "Conversation", "Greeter", "RawUpstream", "SeenRequest"]


@dataclass
class SeenRequest:
    head: bytes
    body: bytes

    @property
    def headers(self) -> dict[str, str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}

    @property
    def request_line(self) -> str:
        return self.head.decode("latin-1").split("\r\n", 1)[0]


@dataclass
class Conversation:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    request: SeenRequest
    connection: int  # which connection (0, 1, ...) carried it
    stop: bool = field(default=False)  # set by the answer: close after it

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0)."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()
        self.stop = True

    def close(self) -> None:
        self.writer.close()
        self.stop = True

    async def hang_up(self) -> None:
        """Close, and return once the client has seen it: it closed its side too (TLS: it
        answered the close_notify)."""
        if self.writer.can_write_eof():  # plain TCP: a FIN, then the client's
            self.writer.write_eof()
            with contextlib.suppress(ConnectionError):
                await self.reader.read()
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()
        self.stop = True

    async def stall(self) -> None:
        """Send nothing more until the client goes away."""
        await self.reader.read()
        self.stop = True


Answer = Callable[[Conversation], Awaitable[None]]


class RawUpstream:
    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.connections = 0
        self.requests: list[SeenRequest] = []
        self.closed_by_client = 0  # connections the client closed (EOF or reset)
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        scheme = "https" if self.tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()  # every conversation ends: its next read or write fails
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=5)
            for task in pending:
                task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        number = self.connections
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                seen = SeenRequest(head[:-4], b"")
                length = int(seen.headers.get("content-length", "0"))
                seen.body = await reader.readexactly(length)
                self.requests.append(seen)
                conversation = Conversation(reader, writer, seen, number)
                await self.answer(conversation)
                if conversation.stop:
                    return
        except ConnectionError:
            self.closed_by_client += 1
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)


class Greeter:
    """Sends ``data`` to every connection once it is made, then closes it (whatever the
    client says): a TLS client meets it instead of a server's handshake. ``data`` None:
    says nothing until the client goes away."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data
        self.url = ""  # https://, as the client will try it
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Greeter:
        self._server = await asyncio.start_server(self._greet, "127.0.0.1", 0)
        self.url = f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            if self.data is None:
                await reader.read()
            else:
                writer.write(self.data)
                await writer.drain()
        writer.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    """A complete answer with ``Content-Length``."""
    lines = [f"HTTP/1.1 {status}", *headers, f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(*chunks: bytes) -> bytes:
    """``chunks`` in chunked transfer coding (without the last, empty chunk)."""
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
