"""What of a client's request head reaches the upstream, through the real proxy with a
scripted upstream that records what it gets:

* a POST asking to upgrade to h2c (what ``curl --http2`` sends over plain HTTP) is
  served as the HTTP/1.1 request it also is, body and all (the CLI's protocol,
  api/protocol.py), whether its body comes with its head or after it;
* the headers the client's ``Connection`` header names are hop-by-hop: never forwarded;
* the client's ``OpenAI-Organization`` / ``OpenAI-Project`` never reach the upstream
  (who is billed is the deployment's choice); the deployment's own ``headers`` do.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, SeenRequest, answer
from support.scripted_upstream import ScriptedUpstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"id":"c","object":"chat.completion","choices":[]}'


async def _ok(conversation: Conversation) -> None:
    await conversation.send(answer(ANSWER, "content-type: application/json"))


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(_ok) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(upstream: ScriptedUpstream) -> Iterator[ProxyInThread]:
    """Served as the CLI serves (``ProxyInThread``'s default: api/direct.py's protocol).
    Model ``billed`` has a deployment that configures its organization and project."""
    billed = {"OpenAI-Organization": "org-deployment", "OpenAI-Project": "proj-deployment"}
    models = [
        {"name": "m", "deployments": [{"id": "d", "base_url": upstream.url, "api_key": "k"}]},
        {
            "name": "billed",
            "deployments": [{"id": "b", "base_url": upstream.url, "headers": billed}],
        },
    ]
    with ProxyInThread(settings_from({"models": models})) as server:
        yield server


def _last(upstream: ScriptedUpstream) -> SeenRequest:
    return upstream.requests[-1]


def _exchange(proxy: ProxyInThread, *parts: bytes) -> bytes:
    """Send ``parts`` one write each on a fresh connection; the answer's bytes."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as connection:
        for part in parts:
            connection.sendall(part)
        received = b""
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            data = connection.recv(65536)
            if not data:
                break
            received += data
    return received


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("split", [False, True], ids=["head-and-body", "body-after-head"])
def test_a_post_asking_for_h2c_is_served_with_its_body(
    proxy: ProxyInThread, upstream: ScriptedUpstream, framing: str, split: bool
) -> None:
    body = orjson.dumps(CHAT)
    if framing == "chunked":
        length, payload = (
            b"transfer-encoding: chunked",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
        )
    else:
        length, payload = b"content-length: %d" % len(body), body
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n"
        b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
        b"http2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\ncontent-type: application/json\r\n"
        + length
        + b"\r\n\r\n"
    )
    received = _exchange(proxy, *((head, payload) if split else (head + payload,)))
    assert received.startswith(b"HTTP/1.1 200 ")
    assert received.endswith(ANSWER)
    seen = _last(upstream)
    assert orjson.loads(seen.body) == CHAT
    for hop in ("upgrade", "http2-settings", "connection"):
        assert hop not in seen.headers


def test_the_connection_after_an_ignored_upgrade_serves_the_next_request(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    body = orjson.dumps(CHAT)
    upgrade = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nconnection: upgrade\r\n"
        b"upgrade: h2c\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as connection:
        for _ in range(2):
            connection.sendall(upgrade)
            received = b""
            while not received.endswith(ANSWER):
                data = connection.recv(65536)
                assert data, "the proxy closed the connection"
                received += data
            assert received.startswith(b"HTTP/1.1 200 ")


def test_headers_named_in_connection_are_not_forwarded(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    headers = {"connection": "keep-alive, x-hop-secret", "x-hop-secret": "s", "x-end": "e"}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200
    seen = _last(upstream).headers
    assert "x-hop-secret" not in seen and seen["x-end"] == "e"


def test_the_client_cannot_choose_the_organization_or_project_billed(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    chosen = {"OpenAI-Organization": "org-client", "OpenAI-Project": "proj-client"}
    assert httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=chosen).is_success
    seen = _last(upstream).headers
    assert "openai-organization" not in seen and "openai-project" not in seen
    billed = {**CHAT, "model": "billed"}
    assert httpx.post(f"{proxy.base_url}/chat/completions", json=billed, headers=chosen).is_success
    seen = _last(upstream).headers
    assert seen["openai-organization"] == "org-deployment"
    assert seen["openai-project"] == "proj-deployment"
