"""A minimal round-robin TCP load balancer: the local stand-in for the stack's nginx.

    python -m loadtest.tcp_lb --listen 127.0.0.1:8080 --backend 127.0.0.1:18103 \\
        --backend 127.0.0.1:18104

Each client connection goes to the next backend in turn (one that refuses the connection
is skipped) and bytes are copied both ways unchanged, so keep-alive HTTP and SSE streams
pass through as they are. Balancing is per connection, as nginx's is per request on its
pooled upstream connections: with many client connections (Locust users) the replicas get
an even share. It exists so the local stack needs no nginx binary; it is not for
production.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
from collections.abc import Iterator
from typing import cast

logger = logging.getLogger("loadtest.tcp_lb")


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


class _BackendSide(asyncio.Protocol):
    """The connection to a backend: what it sends goes to the client."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    # Backpressure: a slow client pauses reading from the backend, not our memory.
    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


class _ClientSide(asyncio.Protocol):
    """A client connection: its bytes go to the backend picked for it."""

    def __init__(self, backends: Iterator[tuple[str, int]], count: int) -> None:
        self._backends = backends
        self._count = count
        self._transport: asyncio.Transport | None = None
        self._backend: asyncio.Transport | None = None
        self._pending: list[bytes] = []
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)
        transport = self._transport
        transport.set_write_buffer_limits(high=256 * 1024)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self._transport is not None
        loop = asyncio.get_running_loop()
        client = self._transport
        for _ in range(self._count):
            host, port = next(self._backends)
            try:
                backend, _ = await loop.create_connection(lambda: _BackendSide(client), host, port)
            except OSError as exc:
                logger.warning("backend %s:%d refused: %s", host, port, exc)
                continue
            if self._closed:  # the client left while we connected
                backend.close()
                return
            self._backend = backend
            for data in self._pending:
                self._backend.write(data)
            self._pending.clear()
            return
        client.close()

    def data_received(self, data: bytes) -> None:
        if self._backend is None:
            self._pending.append(data)
        else:
            self._backend.write(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._backend is not None:
            self._backend.close()

    def pause_writing(self) -> None:
        if self._backend is not None:
            self._backend.pause_reading()

    def resume_writing(self) -> None:
        if self._backend is not None:
            self._backend.resume_reading()


async def serve(listen: tuple[str, int], backends: list[tuple[str, int]]) -> None:
    """Balance until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    rotation = itertools.cycle(backends)
    server = await loop.create_server(
        lambda: _ClientSide(rotation, len(backends)), listen[0], listen[1], backlog=4096
    )
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    logger.info("tcp_lb on %s:%d -> %s", *listen, ", ".join(f"{h}:{p}" for h, p in backends))
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.tcp_lb", description=__doc__)
    parser.add_argument("--listen", type=parse_address, required=True, help="HOST:PORT")
    parser.add_argument(
        "--backend", type=parse_address, action="append", required=True, help="HOST:PORT"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        import uvloop  # faster loop when installed (it is a proxy dependency)
    except ImportError:
        runner = asyncio.Runner()
    else:
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    with runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(serve(args.listen, args.backend))


if __name__ == "__main__":
    main()
