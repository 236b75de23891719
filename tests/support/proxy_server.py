"""Real proxy servers for tests: in a thread of this process, or as separate processes.

``ProxyInThread`` runs ``create_app(settings)`` under uvicorn on a socket bound to
127.0.0.1:0, so tests talk to it over real HTTP. ``ProxyProcess`` runs
``llm-proxy serve --config`` as a child process (replicas, workers, kill tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
import yaml

from proxy.api.direct import DirectReplyProtocol
from proxy.config.settings import Settings, parse_settings
from proxy.process.app import create_app
from support.ports import free_port

T = TypeVar("T")


def settings_from(data: dict[str, Any]) -> Settings:
    return parse_settings(data, "<test>", env={})


class _PromptServer(uvicorn.Server):
    """uvicorn's server, whose main loop also looks at ``should_exit`` when ``wake`` is
    called, not only at its next 0.1 s tick: a stopped proxy begins uvicorn's same
    graceful shutdown at once (tests stop hundreds of them; each waited ~50 ms)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._woken = asyncio.Event()

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """From another thread: have the main loop look at ``should_exit`` now."""
        loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:  # uvicorn's, with the tick's sleep cut short by wake
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 0.1)
            should_exit = await self.on_tick(counter)


class ProxyInThread:
    """``config_path``: the file ``settings`` came from, re-read by ``POST /admin/reload``.
    Served as the CLI serves it (its HTTP protocol, no proxy-headers middleware); ``http``:
    another uvicorn protocol (the ``serving_path`` fixture's portable one: ``"auto"``)."""

    http: type[asyncio.Protocol] | str = DirectReplyProtocol

    def __init__(
        self, settings: Settings, config_path: Path | None = None, *, keep_alive: float = 5.0
    ) -> None:
        """``keep_alive``: uvicorn's keep-alive timeout, seconds (its default: 5)."""
        self.settings = settings
        self.app = create_app(settings, config_path=str(config_path) if config_path else None)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            http=self.http,
            proxy_headers=False,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=keep_alive,
        )
        self._server = _PromptServer(config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self._sock])

    def settled(self, timeout: float = 5.0) -> None:
        """Return once the callbacks the proxy's loop had scheduled by now have run: the
        bookkeeping of answers already sent (their settlement and metrics are loop
        callbacks, run just after the answer is written)."""
        ran = threading.Event()
        self._loop.call_soon_threadsafe(ran.set)
        if not ran.wait(timeout):
            raise TimeoutError("the proxy's loop did not turn")

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on the proxy's own loop (what lives there: its ledger, its
        limiter), its result returned here."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)

    def start(self) -> ProxyInThread:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("proxy did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.wake(self._loop)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            # A shutdown stuck (on a stream, a stopped Redis): forced, so that no replica
            # outlives its test and writes into the next one's Redis.
            print(f"proxy on port {self.port} did not stop in 10 s: forced", file=sys.stderr)
            self._server.force_exit = True
            self._server.wake(self._loop)
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> ProxyInThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProxyProcess:
    """``llm-proxy serve`` in a child process, with its config written to ``workdir``.
    ``module``: what ``python -m`` runs, ``proxy`` or a test wrapper of its CLI from
    ``tests/support`` (``stalled_proxy.STALLED``), which then finds ``support`` on the path."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        workers: int = 1,
        name: str = "proxy",
        env: dict[str, str] | None = None,
        module: str = "proxy",
    ) -> None:
        self.port = free_port()
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        self.workers = workers
        self.env = {**os.environ, **(env or {})}
        self.module = module
        if module != "proxy":
            tests = str(Path(__file__).resolve().parent.parent)
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (tests, self.env.get("PYTHONPATH", "")) if p
            )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 20.0) -> ProxyProcess:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ProxyProcess:
        """Start the process and return at once (``wait_ready``: until it answers)."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.module,
                "serve",
                "--config",
                str(self.config_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float = 20.0) -> ProxyProcess:
        """Return once the launched process answers ``/health/ready`` with 200; stop it
        and fail if it exits first or ``timeout`` seconds pass."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"proxy not ready: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_together([self])

    def _terminate(self) -> None:
        """SIGTERM, not waited for (``_wait_stopped`` after it: ``stop_together``)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def _wait_stopped(self) -> None:
        assert self.process is not None
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)

    def logs(self) -> str:
        return self.log_path.read_text()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_together(stack: ExitStack, proxies: Sequence[ProxyProcess]) -> list[ProxyProcess]:
    """Start ``proxies`` at once (their interpreters start up side by side, not one after
    another) and return them once every one is ready; closing ``stack`` stops them all
    (SIGTERM to each, then each waited for). The same servers, started and stopped as
    ``with ProxyProcess(...)`` one by one would, in the time of about one."""
    stack.callback(stop_together, proxies)
    for proxy in proxies:
        proxy.launch()
    for proxy in proxies:
        proxy.wait_ready()
    return list(proxies)


def stop_together(proxies: Sequence[ProxyProcess]) -> None:
    """``stop`` each of ``proxies``, their graceful shutdowns side by side."""
    for proxy in proxies:
        proxy._terminate()
    for proxy in proxies:
        if proxy.process is not None and proxy.process.poll() is None:
            proxy._wait_stopped()
