"""Running the fake upstream: in a background thread (tests) or in the foreground (CLI)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import ssl
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

from .app import UPSTREAM_KEY, FakeUpstream, build_app
from .config import FakeUpstreamConfig

logger = logging.getLogger("proxy.fake_upstream")

T = TypeVar("T")

# Tests stop servers often; in-flight requests get this long before they are cancelled.
THREAD_SHUTDOWN_TIMEOUT = 0.5
START_TIMEOUT = 10.0


def make_runner(
    app: web.Application, config: FakeUpstreamConfig, shutdown_timeout: float
) -> web.AppRunner:
    """An AppRunner that cancels handlers whose client left and logs no access by default."""
    access: dict[str, Any] = {} if config.access_log else {"access_log": None}
    return web.AppRunner(
        app,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout,
        **access,
    )


async def start_site(
    runner: web.AppRunner, config: FakeUpstreamConfig, ssl_context: ssl.SSLContext | None = None
) -> int:
    """Set up `runner`, listen on the configured address (HTTPS with `ssl_context`);
    returns the bound port."""
    await runner.setup()
    site = web.TCPSite(
        runner, config.host, config.port, reuse_address=True, ssl_context=ssl_context
    )
    await site.start()
    return int(runner.addresses[0][1])


class FakeUpstreamHandle:
    """A fake upstream serving from a background thread with its own event loop."""

    def __init__(
        self,
        config: FakeUpstreamConfig,
        shutdown_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._config = config
        self._ssl = ssl_context
        self._shutdown_timeout = shutdown_timeout
        self.app = build_app(config)
        self.upstream: FakeUpstream = self.app[UPSTREAM_KEY]
        self.host = config.host
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._serve, name=f"fake-upstream-{config.port}", daemon=True
        )

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client's `base_url` should be."""
        return self.url + "/v1"

    def start(self) -> FakeUpstreamHandle:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError("the fake upstream did not start in time")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stats(self) -> dict[str, Any]:
        """The counters, as `GET /stats` returns them."""
        return self._call(self.upstream.snapshot)

    def reset(self) -> None:
        """Zero the counters and the sliding window, as `POST /stats/reset` does."""
        self._call(self.upstream.reset)

    def control(self, **options: Any) -> dict[str, Any]:
        """Change runtime options, as `POST /control` does; ValueError if one is bad."""
        return self._call(lambda: self.upstream.control(options))

    def stop(self) -> None:
        """Close the server (in-flight requests get a short grace) and join the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def __enter__(self) -> FakeUpstreamHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, function: Callable[[], T]) -> T:
        """Run `function` on the server's loop, where the state lives (no data races)."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return function()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(function())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=START_TIMEOUT)

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        runner = make_runner(self.app, self._config, self._shutdown_timeout)
        try:
            self.port = loop.run_until_complete(start_site(runner, self._config, self._ssl))
        except BaseException as exc:
            self._error = exc
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def run_in_thread(
    config: FakeUpstreamConfig | None = None,
    *,
    shutdown_timeout: float = THREAD_SHUTDOWN_TIMEOUT,
    ssl_context: ssl.SSLContext | None = None,
) -> FakeUpstreamHandle:
    """Start a fake upstream in a background thread; returns once it accepts connections.

    `config.port` 0 picks a free port (see `handle.port`); `ssl_context` serves HTTPS
    (with a client-certificate check if the context requires one). Use the handle as a
    context manager, or call `handle.stop()`.
    """
    handle = FakeUpstreamHandle(config or FakeUpstreamConfig(port=0), shutdown_timeout, ssl_context)
    return handle.start()


async def serve(config: FakeUpstreamConfig, shutdown_timeout: float = 5.0) -> None:
    """Serve in the current event loop until SIGINT or SIGTERM."""
    runner = make_runner(build_app(config), config, shutdown_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        port = await start_site(runner, config)
        logger.info(
            "fake upstream listening on http://%s:%d (%s)", config.host, port, config.describe()
        )
        await stop.wait()
    finally:
        await runner.cleanup()
