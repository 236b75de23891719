"""``serve --workers 2``: a worker killed mid-way leaves the other answering every new
connection (the kernel hands connections to whichever worker accepts them)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.proxy_server import ProxyProcess
from support.waiting import wait_until

from loadtest.bench.servers import worker_pids
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "keys": [{"name": "team", "key": "sk-team"}],
        "models": [
            {"name": "gpt-4o-mini", "deployments": [{"id": "a", "base_url": upstream.base_url}]}
        ],
    }


def _ask(conn: socket.socket) -> bytes:
    body = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}'
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-team\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(65536)
        assert chunk, "closed before an answer"
        head += chunk
    return head.split(b"\r\n", 1)[0]


def _answered(proxy: ProxyProcess, count: int) -> list[socket.socket]:
    """``count`` connections opened at once, each then asked a request and answered 200."""
    clients = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(count)]
    assert {_ask(conn) for conn in clients} == {b"HTTP/1.1 200 OK"}
    return clients


def test_when_a_worker_dies_the_other_takes_every_new_connection(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    with ProxyProcess(_config(upstream), tmp_path, workers=2) as proxy:
        assert proxy.process is not None
        started = "Application startup complete."
        wait_until(lambda: proxy.logs().count(started) == 2, timeout=20, what="2 workers")
        for conn in _answered(proxy, 4):
            conn.close()
        os.kill(worker_pids(proxy.process.pid)[0], signal.SIGKILL)

        later = _answered(proxy, 8)  # every one answered, none left to the dead worker
        for conn in later:
            conn.close()
