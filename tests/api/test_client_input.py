"""What a client sends, through the real proxy, before anything is forwarded: the key is
checked from the headers before the body is read, a body that stops arriving is a 408
and its connection closed, two Authorization headers are refused, a request line the
HTTP parser refuses and an encoded slash in a path get OpenAI-shaped answers, and every
answer on every route carries ``x-request-id``."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_client import read_answer

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-client-input"
ADMIN_KEY = "adm-client-input"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
BODY_TIMEOUT = 0.5

pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    config = {
        "keys": [{"name": "app", "key": KEY, "rpm": 1000, "max_parallel": 2}],
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
        "admin": {"keys": [ADMIN_KEY]},
        "server": {"max_body_size": "4KB", "body_timeout": f"{BODY_TIMEOUT}s"},
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


@pytest.fixture
def own_protocol(serving_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's own HTTP protocol (the CLI's), with this module's body timeout (the
    CLI hands it over in the environment)."""
    if serving_path != "fast":
        pytest.skip("the proxy's own HTTP protocol only (the portable path is stock uvicorn)")
    monkeypatch.setattr("proxy.api.protocol._body_timeout", lambda: BODY_TIMEOUT)


def _connect(proxy: ProxyInThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _head(path: str = "/v1/chat/completions", length: int = 9_000_000, *extra: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _closed_by_peer(conn: socket.socket, within: float) -> bool:
    """Whether the proxy closes ``conn`` within ``within`` seconds (reading what is left)."""
    conn.settimeout(within)
    try:
        while conn.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def _assert_error(status: int, headers: dict[str, str], body: bytes, expected: int) -> None:
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    assert headers["x-request-id"].startswith("req_")
    assert set(orjson.loads(body)["error"]) == {"message", "type", "param", "code"}


# --- the key before the body ----------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "code"),
    [("Authorization: Bearer wrong-key", "invalid_api_key"), (None, "missing_api_key")],
    ids=["wrong-key", "no-key"],
)
def test_a_stranger_gets_401_before_sending_its_body(
    proxy: ProxyInThread, authorization: str | None, code: str
) -> None:
    """20 clients at once whose headers announce 9 MB, then send a byte: each gets its
    401 anyway (nothing of a stranger's body is waited for or held)."""
    extra = [authorization] if authorization else []
    connections = [_connect(proxy) for _ in range(20)]
    try:
        for conn in connections:
            conn.sendall(_head("/v1/chat/completions", 9_000_000, *extra) + b"{")
        for conn in connections:
            status, headers, body = read_answer(conn)
            _assert_error(status, headers, body, 401)
            assert code.encode() in body
    finally:
        for conn in connections:
            conn.close()


def test_a_strangers_body_that_trickles_on_after_the_401_is_closed(
    proxy: ProxyInThread, own_protocol: None
) -> None:
    """After the early 401 the rest of the body is discarded as it comes, but no longer
    than the body timeout: a client trickling bytes holds no connection for long."""
    with _connect(proxy) as conn:
        conn.sendall(_head("/v1/chat/completions", 9_000_000, "Authorization: Bearer nope"))
        status, _, _ = read_answer(conn)
        assert status == 401
        closed = False
        for _ in range(int(10 / 0.1)):  # a byte every 0.1 s, for at most 10 s
            try:
                conn.sendall(b" ")
            except OSError:
                closed = True
                break
            if _closed_by_peer(conn, 0.1):
                closed = True
                break
    assert closed


def test_a_body_that_stops_arriving_is_a_408_and_the_connection_closes(
    proxy: ProxyInThread,
) -> None:
    with _connect(proxy) as conn:
        conn.sendall(_head("/v1/chat/completions", 200, f"Authorization: Bearer {KEY}") + b"{")
        status, headers, body = read_answer(conn)
        _assert_error(status, headers, body, 408)
        assert b"request_timeout" in body
        assert headers.get("connection") == "close"
        assert _closed_by_peer(conn, 5.0)
    # Nothing of the key's was taken: both its parallel slots serve at once.
    answer = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert answer.status_code == 200
    assert answer.headers["x-ratelimit-remaining-requests"] == "999"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", "/v1/chat/completions", CHAT), ("GET", "/v1/models", None)],
)
def test_two_authorization_headers_are_refused(
    proxy: ProxyInThread, method: str, path: str, body: Any
) -> None:
    """Which one counts would depend on who reads them (a gateway before the proxy may
    take the first): refused, whichever order, on every route."""
    for first, last in ((KEY, "other"), ("other", KEY)):
        response = httpx.request(
            method,
            f"{proxy.url}{path}",
            json=body,
            headers=[("authorization", f"Bearer {first}"), ("authorization", f"Bearer {last}")],
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "duplicate_authorization"
        assert response.headers["x-request-id"]


# --- what the HTTP layer refuses ------------------------------------------------------


@pytest.mark.parametrize(
    "request_line",
    [b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/9.9\r\n\r\n", b"GET / \x01\r\n\r\n"],
    ids=["no-version", "bad-version", "control-character"],
)
def test_a_request_the_parser_refuses_gets_an_openai_shaped_400(
    proxy: ProxyInThread, own_protocol: None, request_line: bytes
) -> None:
    with _connect(proxy) as conn:
        conn.sendall(request_line)
        status, headers, body = read_answer(conn)
        _assert_error(status, headers, body, 400)
        assert headers["connection"] == "close"
        assert _closed_by_peer(conn, 5.0)


@pytest.mark.parametrize(
    "path", ["/v1/chat%2fcompletions", "/v1/chat%2Fcompletions", "/v1%2fchat/completions"]
)
def test_an_encoded_slash_is_not_the_endpoint_it_decodes_to(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle, path: str
) -> None:
    before = upstream.stats()["requests"]
    response = httpx.post(f"{proxy.url}{path}", json=CHAT, headers=AUTH)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "unknown_url"
    assert response.headers["x-request-id"]
    assert upstream.stats()["requests"] == before


# --- x-request-id everywhere -----------------------------------------------------------

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ROUTES: list[tuple[str, str, dict[str, str], Any, int]] = [
    ("POST", "/v1/chat/completions", AUTH, CHAT, 200),
    ("GET", "/v1/models", AUTH, None, 200),
    ("GET", "/v1/models/m", AUTH, None, 200),
    ("GET", "/v1/models/nope", AUTH, None, 404),
    ("GET", "/health/live", {}, None, 200),
    ("GET", "/health/ready", {}, None, 200),
    ("GET", "/metrics", {}, None, 200),
    ("GET", "/admin/state", ADMIN, None, 200),
    ("GET", "/admin/state", {}, None, 401),
    ("POST", "/admin/reload", ADMIN, None, 400),  # no file to re-read: still answered
    ("GET", "/nowhere", {}, None, 404),
    ("GET", "/v1/chat/completions", AUTH, None, 405),
    ("POST", "/v1/chat/completions", {}, CHAT, 401),
    ("POST", "/v1/chat/completions", {**AUTH, "x-big": "a" * 9000}, CHAT, 431),
    ("GET", "/v1/models", {"x-big": "a" * 9000}, None, 431),
    ("POST", "/v1/chat/completions", AUTH, {**CHAT, "pad": "x" * 5000}, 413),
    ("POST", "/v1/chat/completions", AUTH, {"model": "unknown"}, 404),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    ROUTES,
    ids=[f"{m} {p} {s}" for m, p, _, _, s in ROUTES],
)
def test_every_answer_on_every_route_carries_a_request_id(
    proxy: ProxyInThread,
    method: str,
    path: str,
    headers: dict[str, str],
    body: Any,
    status: int,
) -> None:
    response = httpx.request(method, f"{proxy.url}{path}", json=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"].startswith("req_")
    assert len(response.headers.get_list("x-request-id")) == 1


def test_request_ids_differ_between_answers(proxy: ProxyInThread) -> None:
    ids = {httpx.get(f"{proxy.url}/health/live").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3
