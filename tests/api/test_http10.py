"""An HTTP/1.0 client through the real proxy, on both serving paths: it cannot read a
chunked body (RFC 9112 6.1), so every answer it gets is framed by a ``content-length``
or by the connection closing, plain or streamed, on chat and on the Responses API (its
creates and a stored response's events), whichever cycle serves it (a query string goes
through uvicorn's)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_client import read_to_close

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-http10"
MODEL = "m"
pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0.001)) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    config = {
        "keys": [{"name": "app", "key": KEY}],
        "models": [{"name": MODEL, "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


def _ask(
    proxy: ProxyInThread, method: str, target: str, body: bytes = b"", *extra: str
) -> tuple[str, int, dict[str, str], bytes]:
    """One HTTP/1.0 request on a connection of its own; its answer, read until the proxy
    closes the connection (within the socket's timeout: a connection left open fails)."""
    lines = [f"{method} {target} HTTP/1.0", "Host: x", f"Authorization: Bearer {KEY}", *extra]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return read_to_close(conn)


def _assert_framed_for_http10(headers: dict[str, str], body: bytes) -> None:
    assert "transfer-encoding" not in headers, headers
    if "content-length" in headers:
        assert int(headers["content-length"]) == len(body)
    else:  # close-delimited: the connection's end is the body's
        assert headers["connection"] == "close"


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
RESPONSE = {"model": MODEL, "input": "hi", "max_output_tokens": 16}
ASKS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions?via=cycle", CHAT),  # a query: uvicorn's cycle, same endpoint
    ("/v1/responses", RESPONSE),
]


@pytest.mark.parametrize("keep_alive", [False, True], ids=["plain", "keep-alive-asked"])
@pytest.mark.parametrize(("target", "body"), ASKS, ids=[target for target, _ in ASKS])
def test_a_buffered_answer_to_http10_has_a_length(
    proxy: ProxyInThread, target: str, body: dict[str, object], keep_alive: bool
) -> None:
    extra = ["Connection: keep-alive"] if keep_alive else []
    _, status, headers, answer = _ask(proxy, "POST", target, orjson.dumps(body), *extra)
    assert status == 200, answer
    _assert_framed_for_http10(headers, answer)
    assert "content-length" in headers
    assert orjson.loads(answer)["model"]


@pytest.mark.parametrize(("target", "body"), ASKS, ids=[target for target, _ in ASKS])
def test_a_stream_to_http10_is_not_chunked(
    proxy: ProxyInThread, target: str, body: dict[str, object]
) -> None:
    _, status, headers, answer = _ask(proxy, "POST", target, orjson.dumps({**body, "stream": True}))
    assert status == 200, answer
    assert headers["content-type"].startswith("text/event-stream")
    _assert_framed_for_http10(headers, answer)
    events = [line for line in answer.split(b"\n") if line.startswith(b"data: ")]
    if target.startswith("/v1/chat"):
        assert events[-1] == b"data: [DONE]"
        assert all(orjson.loads(event[6:])["object"] for event in events[:-1])  # whole JSON
    else:
        assert orjson.loads(events[-1][6:])["type"] == "response.completed"


def test_a_stored_responses_events_to_http10_are_not_chunked(proxy: ProxyInThread) -> None:
    """``GET /v1/responses/{id}?stream=true``: a route beside forwarding, streamed too."""
    created = httpx.post(
        f"{proxy.base_url}/responses",
        json={**RESPONSE, "background": True},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert created.status_code == 200, created.text
    target = f"/v1/responses/{created.json()['id']}?stream=true"
    _, status, headers, answer = _ask(proxy, "GET", target)
    assert status == 200, answer
    _assert_framed_for_http10(headers, answer)
    assert b"response.completed" in answer


def test_a_stream_sent_whole_is_bounded_by_max_upstream_body_size(
    upstream: FakeUpstreamHandle, serving_path: str
) -> None:
    """The portable path collects an HTTP/1.0 client's stream to send it with its length:
    at most ``server.max_upstream_body_size``, past it a 502 in the contract's shape
    (the proxy's own protocol passes it through as it comes, ended by the close)."""
    config = {
        "keys": [{"name": "app", "key": KEY}],
        "models": [{"name": MODEL, "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
        "server": {"max_upstream_body_size": 2048},
    }
    body = orjson.dumps({**CHAT, "max_tokens": 200, "stream": True})
    with ProxyInThread(settings_from(config)) as proxy:
        _, status, headers, answer = _ask(proxy, "POST", "/v1/chat/completions", body)
    _assert_framed_for_http10(headers, answer)
    if serving_path == "fast":
        assert status == 200 and len(answer) > 2048 and answer.endswith(b"data: [DONE]\n\n")
    else:
        assert status == 502, answer
        error = orjson.loads(answer)["error"]
        assert error["code"] == "upstream_error" and "max_upstream_body_size" in error["message"]
        assert headers["x-request-id"].startswith("req_")
