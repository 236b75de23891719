"""What reaches the proxy at the HTTP level: oversized headers get an OpenAI-shaped 431
and are never forwarded; connections that send their headers too slowly are closed; the
answers say how long the proxy itself took; /metrics can require a token."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.proxy_server import ProxyInThread, ProxyProcess, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, **server: object) -> dict[str, object]:
    deployment = {"id": "d", "base_url": upstream.base_url, "rpm": 6000}
    return {"models": [{"name": "m", "deployments": [deployment]}], "server": server}


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(_config(upstream, metrics_token="s3cret"))) as server:
        yield server


@pytest.mark.parametrize(
    "headers",
    [
        {"x-big": "a" * 9000},  # one header over 8 KiB
        {f"x-h{i}": "b" * 1000 for i in range(40)},  # 40 KiB in all
    ],
    ids=["one-header", "in-all"],
)
def test_oversized_headers_are_431_and_never_forwarded(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle, headers: dict[str, str]
) -> None:
    before = upstream.stats()["requests"]
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 431
    error = response.json()["error"]
    assert error["code"] == "request_headers_too_large" and error["type"]
    assert upstream.stats()["requests"] == before


def test_answers_say_the_proxys_own_time_and_the_wait(proxy: ProxyInThread) -> None:
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert float(response.headers["x-llm-proxy-overhead-ms"]) >= 0
    assert "x-llm-proxy-queue-ms" not in response.headers  # it did not wait


def test_metrics_need_the_token_when_one_is_set(proxy: ProxyInThread) -> None:
    assert httpx.get(f"{proxy.url}/metrics").status_code == 401
    wrong = httpx.get(f"{proxy.url}/metrics", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"]
    right = httpx.get(f"{proxy.url}/metrics", headers={"authorization": "Bearer s3cret"})
    assert right.status_code == 200 and "llmproxy_" in right.text


@pytest.mark.slow
def test_slow_header_senders_are_closed_while_others_are_served(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    """200 connections that never finish their headers are closed after header_timeout;
    meanwhile ordinary requests keep being answered (bounded: 200 sockets, loopback)."""
    config = _config(upstream, header_timeout="1s")
    with ProxyProcess(config, tmp_path, name="slowloris") as proxy:
        host, port = "127.0.0.1", int(proxy.url.rsplit(":", 1)[1])
        slow = []
        for _ in range(200):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(s)
        try:
            for _ in range(5):  # served meanwhile
                answer = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=5)
                assert answer.status_code == 200

            def all_closed() -> bool:
                return all(_closed_by_peer(s) for s in slow)

            wait_until(all_closed, timeout=15, what="slow header senders closed")
        finally:
            for s in slow:
                s.close()


def _closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False  # still open, nothing to read
    except OSError:
        return True
    finally:
        s.setblocking(True)


@pytest.mark.slow
def test_a_strangers_trickling_body_is_closed_after_the_body_timeout(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    """As the CLI serves (server.body_timeout reaches the HTTP protocol of its worker):
    a wrong key's 401 comes before its body, and the body it trickles on is cut off."""
    config = {
        **_config(upstream, body_timeout="1s"),
        "keys": [{"name": "app", "key": "sk-right"}],
    }
    with ProxyProcess(config, tmp_path, name="trickle") as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer no\r\n"
                b"Content-Type: application/json\r\nContent-Length: 9000000\r\n\r\n{"
            )
            assert conn.recv(12).startswith(b"HTTP/1.1 401")

            def closed() -> bool:
                try:
                    conn.sendall(b" ")  # a byte now and then: the body never stalls
                except OSError:
                    return True
                return _closed_by_peer(conn)

            wait_until(closed, timeout=15, what="the trickling body's connection closed")
