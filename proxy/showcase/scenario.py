"""Run the showcase: the same calls, naive and through the proxy, side by side.

Each side has its own fake upstream with the same strict limit (a sliding window of one
second) and latency; the proxy side's upstream sits behind the proxy, configured with
that limit as a user would configure their provider's. Both sides start together and
use the same client: the OpenAI SDK with its default retries (which honour the
upstream's ``retry-after``), every HTTP request it sends recorded by an httpx hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy.showcase.report import Attempt, Call, Side, from_first_request

__all__ = ["Scenario", "run"]

MODEL = "gpt-4o-mini"
CLIENT_KEY = "showcase-key"
CALL_HEADER = "x-showcase-call"
START_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """The seed scenario by default: 10 concurrent calls, an upstream that takes 2 a
    second and answers in 2-5 s, the SDK's default 2 retries."""

    calls: int = 10
    upstream_rps: int = 2
    latency: tuple[float, float] = (2.0, 5.0)
    retries: int = 2


def proxy_config(upstream_url: str, scenario: Scenario) -> dict[str, Any]:
    """The proxy as a user would set it up: the upstream's limit, one client key."""
    return {
        "keys": [{"name": "showcase", "key": CLIENT_KEY}],
        "models": [
            {
                "name": MODEL,
                "deployments": [
                    {
                        "id": "strict-upstream",
                        "base_url": f"{upstream_url}/v1",
                        "api_key": "upstream-key",
                        "rpm": scenario.upstream_rps * 60,
                    }
                ],
            }
        ],
        "server": {"log_level": "warning"},
    }


async def run(scenario: Scenario) -> list[Side]:
    """Both sides at once; returns (naive, through the proxy)."""
    naive_port, proxied_port, proxy_port = _free_ports(3)
    naive_upstream, proxied_upstream = (f"http://127.0.0.1:{p}" for p in (naive_port, proxied_port))
    proxy = f"http://127.0.0.1:{proxy_port}"
    with (
        tempfile.TemporaryDirectory(prefix="llm-proxy-showcase-") as workdir,
        _Children(Path(workdir)) as children,
    ):
        config = Path(workdir) / "proxy.yaml"
        config.write_text(yaml.safe_dump(proxy_config(proxied_upstream, scenario)))
        # Each in a process of its own, as in production: no thread of this interpreter
        # delays an upstream's clock or the proxy's turns.
        children.start(_upstream_argv(scenario, naive_port), f"{naive_upstream}/stats")
        children.start(_upstream_argv(scenario, proxied_port), f"{proxied_upstream}/stats")
        children.start(
            ["serve", "--config", str(config), "--port", str(proxy_port)], f"{proxy}/health/ready"
        )
        children.wait_ready()
        start = time.monotonic()
        naive, proxied = await asyncio.gather(
            _calls(f"{naive_upstream}/v1", "upstream-key", scenario, start),
            _calls(f"{proxy}/v1", CLIENT_KEY, scenario, start),
        )
        return from_first_request(
            [
                Side("naive client, straight to the upstream", naive, _rejected(naive_upstream)),
                Side("the same client, through the proxy", proxied, _rejected(proxied_upstream)),
            ]
        )


def _upstream_argv(scenario: Scenario, port: int) -> list[str]:
    low, high = scenario.latency
    return [
        "fake-upstream",
        "--port", str(port),
        "--rpm", str(scenario.upstream_rps),
        "--window", "1",
        "--latency", f"{low:g}-{high:g}",
        "--log-level", "WARNING",
    ]  # fmt: skip


def _rejected(upstream_url: str) -> int:
    """The 429s the upstream answered, by its own count."""
    return int(httpx.get(f"{upstream_url}/stats", timeout=10).json()["rejected"])


class _Children:
    """``llm-proxy`` child processes, ended when the block ends; their stderr in
    ``log_dir`` (a file: a pipe nobody reads could fill and stall them)."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._started: list[tuple[subprocess.Popen[bytes], str, list[str], Path]] = []

    def start(self, argv: list[str], ready_url: str) -> None:
        log = self._log_dir / f"child-{len(self._started)}.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "proxy", *argv],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, "LLM_PROXY_LOG_LEVEL": "warning"},
            )
        self._started.append((process, ready_url, argv, log))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        for process, url, argv, log in self._started:
            while not _answers(url):
                if process.poll() is not None:
                    error = log.read_text(errors="replace").strip()
                    raise RuntimeError(f"llm-proxy {shlex.join(argv)} stopped: {error}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing answered at {url} within {START_TIMEOUT:g} s")
                time.sleep(0.05)

    def __enter__(self) -> _Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for process, *_ in self._started:
            process.terminate()
        for process, *_ in self._started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _free_ports(count: int) -> list[int]:
    """Ports free now (held open together, so they differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


async def _calls(base_url: str, api_key: str, scenario: Scenario, start: float) -> list[Call]:
    """``scenario.calls`` concurrent chat completions by the OpenAI SDK at ``base_url``."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    calls = [Call() for _ in range(scenario.calls)]
    sent: dict[int, float] = {}  # id(request) -> when it was sent

    async def on_request(request: Any) -> None:  # the SDK's httpx request
        sent[id(request)] = time.monotonic() - start

    async def on_response(response: Any) -> None:
        request = response.request
        call = calls[int(request.headers[CALL_HEADER])]
        call.attempts.append(
            Attempt(
                start=sent.pop(id(request)),
                end=time.monotonic() - start,
                status=response.status_code,
                waited=_queue_seconds(response.headers.get("x-llm-proxy-queue-ms")),
            )
        )

    hooks: dict[str, list[Callable[[Any], Awaitable[None]]]] = {
        "request": [on_request],
        "response": [on_response],
    }
    async with DefaultAsyncHttpxClient(event_hooks=hooks, timeout=60.0) as http:
        client = AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=scenario.retries, http_client=http
        )

        async def one(index: int) -> None:
            try:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"Call {index}"}],
                    extra_headers={CALL_HEADER: str(index)},
                )
            except Exception as exc:  # the client's own failure is the measurement
                calls[index].error = type(exc).__name__
            calls[index].end = time.monotonic() - start

        await asyncio.gather(*(one(i) for i in range(scenario.calls)))
    return calls


def _queue_seconds(header: str | None) -> float:
    """``x-llm-proxy-queue-ms`` in seconds; 0 when absent or not a sane number."""
    try:
        millis = float(header) if header is not None else 0.0
    except ValueError:
        return 0.0
    return millis / 1000 if math.isfinite(millis) and 0 <= millis <= 3_600_000 else 0.0
