"""The proxy's own HTTP/1.1 protocol (api/direct.py) answers forwarding requests as
uvicorn's ASGI cycle would: whole replies with their length and date, keep-alive (an
idle connection closed once its keep-alive timeout has passed, one in use kept),
pipelined requests in order, HTTP/1.0 closing, ``Expect: 100-continue``, targets it does
not serve itself (a query, a trailing slash) served through the ASGI cycle; a reply goes
out in one write, and one whose headers could split the response never goes out."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from proxy.api import direct
from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread
from proxy.request.call import Reply

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


KEEP_ALIVE = 1.0  # seconds, uvicorn's keep-alive timeout for these tests


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyInThread]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as upstream:
        deployment = {"id": "d", "base_url": upstream.base_url, "rpm": 6000}
        config = {"models": [{"name": "m", "deployments": [deployment]}]}
        with ProxyInThread(settings_from(config), keep_alive=KEEP_ALIVE) as server:
            yield server


def _request(version: str = "1.1", extra: str = "", target: str = "/v1/chat/completions") -> bytes:
    return (
        f"POST {target} HTTP/{version}\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode() + BODY


def _read_answer(reader: Any) -> tuple[str, dict[str, str], bytes]:
    status = reader.readline().decode().strip()
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    return status, headers, reader.read(int(headers["content-length"]))


def _connect(proxy: ProxyInThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def test_keep_alive_requests_get_whole_answers(proxy: ProxyInThread) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        for _ in range(3):
            conn.sendall(_request())
            status, headers, body = _read_answer(reader)
            assert status == "HTTP/1.1 200 OK"
            assert "date" in headers and headers["x-request-id"].startswith("req_")
            assert json.loads(body)["object"] == "chat.completion"


def test_an_idle_connection_is_closed_once_its_keep_alive_has_passed(
    proxy: ProxyInThread,
) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        conn.sendall(_request())
        assert _read_answer(reader)[0] == "HTTP/1.1 200 OK"
        wait_until(lambda: reader.read(1) == b"", timeout=15, what="the idle connection closed")


@pytest.mark.slow
def test_a_connection_in_use_outlives_its_keep_alive(proxy: ProxyInThread) -> None:
    """Requests a short while apart, for longer than the keep-alive timeout in all."""
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        for _ in range(int(3 * KEEP_ALIVE / 0.05)):
            conn.sendall(_request())
            assert _read_answer(reader)[0] == "HTTP/1.1 200 OK"
            time.sleep(0.05)


@pytest.mark.parametrize("target", ["/v1/chat/completions/", "/v1/chat/completions?x=1"])
def test_a_target_the_protocol_does_not_serve_itself_is_served_as_asgi(
    proxy: ProxyInThread, target: str
) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        for _ in range(2):
            conn.sendall(_request(target=target))
            status, headers, body = _read_answer(reader)
            assert status == "HTTP/1.1 200 OK" and headers["x-request-id"].startswith("req_")
            assert json.loads(body)["object"] == "chat.completion"


def test_pipelined_requests_are_answered_in_order(proxy: ProxyInThread) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        conn.sendall(_request() + _request() + _request())
        ids = []
        for _ in range(3):
            status, headers, _ = _read_answer(reader)
            assert status == "HTTP/1.1 200 OK"
            ids.append(headers["x-request-id"])
    assert ids == sorted(ids) and len(set(ids)) == 3  # the proxy numbers them as they come


def test_an_http_1_0_request_is_answered_then_closed(proxy: ProxyInThread) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        conn.sendall(_request("1.0"))
        status, headers, _ = _read_answer(reader)
        assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
        assert reader.read() == b""  # closed by the proxy


def test_expect_100_continue_is_honoured(proxy: ProxyInThread) -> None:
    with _connect(proxy) as conn, conn.makefile("rb") as reader:
        head, body = _request(extra="Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        conn.sendall(head + b"\r\n\r\n")
        assert reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert reader.readline() == b"\r\n"
        conn.sendall(body)
        status, _, _ = _read_answer(reader)
        assert status == "HTTP/1.1 200 OK"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True


def _cycle(keep_alive: bool = True) -> SimpleNamespace:
    done: list[bool] = []
    return SimpleNamespace(
        transport=_Transport(),
        flow=SimpleNamespace(write_paused=False),
        disconnected=False,
        keep_alive=keep_alive,
        default_headers=[(b"date", b"Mon, 23 Nov 2026 10:00:00 GMT")],
        response_started=False,
        response_complete=False,
        waiting_for_100_continue=True,
        message_event=asyncio.Event(),
        on_response=lambda: done.append(True),
        done=done,
    )


def test_a_reply_goes_out_in_one_write_and_completes_the_cycle() -> None:
    cycle = _cycle()
    reply = Reply(200, {"Content-Type": "application/json", "x-request-id": "r1"}, b"{}")
    asyncio.run(direct.write_reply(cycle, reply))  # type: ignore[arg-type]
    assert cycle.transport.writes == [
        b"HTTP/1.1 200 OK\r\ndate: Mon, 23 Nov 2026 10:00:00 GMT\r\n"
        b"content-type: application/json\r\nx-request-id: r1\r\ncontent-length: 2\r\n\r\n{}"
    ]
    assert cycle.response_complete and cycle.message_event.is_set() and cycle.done == [True]
    assert not cycle.waiting_for_100_continue and not cycle.transport.closed


def test_a_connection_that_ends_says_so_and_is_closed() -> None:
    cycle = _cycle(keep_alive=False)
    asyncio.run(direct.write_reply(cycle, Reply(429, {}, b"x")))  # type: ignore[arg-type]
    assert b"connection: close\r\n" in cycle.transport.writes[0]
    assert cycle.transport.writes[0].startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert cycle.transport.closed


@pytest.mark.parametrize("value", ["a\r\nset-cookie: x", "a\nb", "a\rb", "a\x00b", "a\x1fb"])
def test_a_header_that_could_split_the_answer_never_goes_out(value: str) -> None:
    cycle = _cycle()
    with pytest.raises(RuntimeError, match="Invalid HTTP header"):
        asyncio.run(direct.write_reply(cycle, Reply(200, {"x-bad": value}, b"{}")))  # type: ignore[arg-type]
    assert cycle.transport.writes == [] and not cycle.response_started


def test_the_direct_cycle_has_exactly_the_attributes_of_uvicorns_cycle() -> None:
    """``_DirectCycle`` sets uvicorn's attributes itself (not through its constructor): an
    uvicorn whose cycle gains or loses one is caught here, not on the request path."""
    protocol = SimpleNamespace(
        parser=SimpleNamespace(should_keep_alive=lambda: True, get_http_version=lambda: "1.1"),
        transport=_Transport(),
        flow=SimpleNamespace(),
        logger=None,
        access_logger=None,
        server_state=SimpleNamespace(default_headers=[]),
        on_response_complete=lambda: None,
        expect_100_continue=False,
    )
    ours = direct._DirectCycle(protocol, True)  # type: ignore[arg-type]
    theirs = RequestResponseCycle(
        scope=cast(Any, {}),
        transport=protocol.transport,
        flow=protocol.flow,
        logger=protocol.logger,
        access_logger=protocol.access_logger,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    assert sorted(vars(ours)) == sorted(vars(theirs))
    assert ours.keep_alive and not ours.waiting_for_100_continue and ours.more_body
