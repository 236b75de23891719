"""What the proxy makes of the bytes an upstream sends, through the real proxy on both
upstream transports (the ``serving_path`` fixture: lean, then general) with a scripted
upstream on 127.0.0.1:

* answers of any size up to ``server.max_upstream_body_size`` pass whole, buffered and
  streamed; a larger one is a clean 502 ``upstream_error``, never a hang;
* a gzip-encoded body is decoded (the client gets what its headers describe) and its
  usage counted; a gzip bomb or a corrupt body stays bounded and OpenAI-shaped;
* an upstream that is no LLM API (a base_url missing its /v1) answering an error that
  is not JSON gets the contract's shape: 502 ``upstream_error`` naming the deployment
  and the URL, or the client's own status when the answer is about its request.
"""

from __future__ import annotations

import base64
import gzip
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer, chunked
from support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.usefixtures("serving_path")  # the lean and the general transport

MB = 1_000_000
SECRET = "sk-upstream-secret-0123456789"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
JSON = "content-type: application/json"
SSE = "content-type: text/event-stream"
USAGE = {"prompt_tokens": 1234, "completion_tokens": 567, "total_tokens": 1801}


def _embeddings(size: int) -> bytes:
    """An embeddings answer of exactly ``size`` bytes (one long base64 vector)."""
    head = b'{"object":"list","model":"m","data":[{"object":"embedding","index":0,"embedding":"'
    tail = b'"}],"usage":{"prompt_tokens":3,"total_tokens":3}}'
    pad = size - len(head) - len(tail)
    return head + base64.b64encode(b"\x07" * (pad // 4 * 3)).ljust(pad, b"A") + tail


def _events(size: int) -> list[bytes]:
    """SSE events of a chat stream, about ``size`` bytes in all, ending with usage."""
    content = "x" * 60_000
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0}]}
    chunk["choices"][0]["delta"] = {"content": content}
    event = b"data: " + orjson.dumps(chunk) + b"\n\n"
    events = [event] * max(size // len(event), 1)
    usage = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": USAGE}
    return [*events, b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]


def _config(url: str, **server: Any) -> dict[str, Any]:
    deployment = {"id": "d", "base_url": url, "api_key": SECRET, "timeout": "10s"}
    return {
        "models": [{"name": "m", "deployments": [deployment]}],
        "routing": {"retries": 0},
        "server": server,
    }


@contextmanager
def _proxy_before(reply: Callable[[Conversation], Any], **server: Any) -> Iterator[ProxyInThread]:
    with (
        ScriptedUpstream(reply) as upstream,
        ProxyInThread(settings_from(_config(upstream.url, **server))) as proxy,
    ):
        yield proxy


def _streamed(conversation: Conversation) -> bool:
    return orjson.loads(conversation.request.body).get("stream") is True


def _tokens(proxy: ProxyInThread) -> dict[str, float]:
    """llmproxy_tokens_total of deployment d, by kind."""
    proxy.settled()
    text = httpx.get(f"{proxy.url}/metrics").text
    found = re.findall(
        r'llmproxy_tokens_total\{[^}]*deployment="d",kind="(\w+)"[^}]*\} (\S+)', text
    )
    return {kind: float(value) for kind, value in found}


# --- answers of any size -------------------------------------------------------------


@pytest.fixture(scope="module")
def sized(serving_path: str) -> Iterator[ProxyInThread]:
    """Answers as large as the request's ``size`` asks: buffered (an embeddings answer
    with a content-length) or streamed (chunked SSE)."""

    async def reply(conversation: Conversation) -> None:
        body = orjson.loads(conversation.request.body)
        size = int(body["user"])
        if body.get("stream") is True:
            await conversation.send(b"HTTP/1.1 200 OK\r\n" + SSE.encode())
            await conversation.send(b"\r\ntransfer-encoding: chunked\r\n\r\n")
            for event in _events(size):
                await conversation.send(chunked(event))
            await conversation.send(b"0\r\n\r\n")
        else:
            await conversation.send(answer(_embeddings(size), JSON))

    with _proxy_before(reply) as proxy:
        yield proxy


@pytest.mark.slow
@pytest.mark.parametrize("size", [1 * MB, 5 * MB, 50 * MB], ids=["1MB", "5MB", "50MB"])
def test_a_buffered_answer_of_any_size_up_to_the_bound_passes_whole(
    sized: ProxyInThread, size: int
) -> None:
    request = {"model": "m", "input": "hi", "user": str(size)}
    response = httpx.post(f"{sized.base_url}/embeddings", json=request, timeout=60)
    assert response.status_code == 200
    assert response.content == _embeddings(size)


@pytest.mark.slow
@pytest.mark.parametrize("size", [1 * MB, 5 * MB, 50 * MB], ids=["1MB", "5MB", "50MB"])
def test_a_streamed_answer_of_any_size_passes_whole(sized: ProxyInThread, size: int) -> None:
    request = {**CHAT, "stream": True, "user": str(size)}
    request["stream_options"] = {"include_usage": True}  # passed on as it is
    with httpx.stream("POST", f"{sized.base_url}/chat/completions", json=request) as response:
        received = response.read()
    assert response.status_code == 200
    assert received == b"".join(_events(size))


@pytest.mark.slow
def test_an_answer_over_the_bound_is_a_502_and_the_next_one_is_served() -> None:
    """A body announced over ``server.max_upstream_body_size``, one that runs over it
    without announcing its length, and a small one after them."""

    async def reply(conversation: Conversation) -> None:
        size = int(orjson.loads(conversation.request.body)["user"])
        body = _embeddings(size)
        if size > MB:  # no content-length: only reading it shows its size
            await conversation.send(
                f"HTTP/1.1 200 OK\r\n{JSON}\r\nconnection: close\r\n\r\n".encode()
            )
            await conversation.send(body)
            conversation.close()
        else:
            await conversation.send(answer(body, JSON))

    with _proxy_before(reply, max_upstream_body_size="1MiB") as proxy:
        for size in (3 * MB, 2 * MB, MB // 2):
            request = {"model": "m", "input": "hi", "user": str(size)}
            response = httpx.post(f"{proxy.base_url}/embeddings", json=request, timeout=30)
            if size > MB:
                assert response.status_code == 502
                error = response.json()["error"]
                assert error["code"] == "upstream_error" and error["type"] == "api_error"
                assert "'d'" in error["message"] and "max_upstream_body_size" in error["message"]
            else:
                assert response.status_code == 200 and response.content == _embeddings(size)


# --- gzip ------------------------------------------------------------------------------


def _chat_answer() -> bytes:
    message = {"role": "assistant", "content": "hello"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {"id": "c", "object": "chat.completion", "choices": [choice], "usage": USAGE}
    return orjson.dumps(body)


def test_a_gzipped_answer_reaches_the_client_decoded_and_its_usage_counts() -> None:
    plain = _chat_answer()

    async def reply(conversation: Conversation) -> None:
        if _streamed(conversation):
            packed = gzip.compress(b"".join(_events(200_000)))
            head = f"HTTP/1.1 200 OK\r\n{SSE}\r\ncontent-encoding: gzip\r\n"
            await conversation.send(head.encode() + b"transfer-encoding: chunked\r\n\r\n")
            for at in range(0, len(packed), 1000):  # cut anywhere, as a network does
                await conversation.send(chunked(packed[at : at + 1000]))
            await conversation.send(b"0\r\n\r\n")
        else:
            await conversation.send(answer(gzip.compress(plain), JSON, "content-encoding: gzip"))

    with _proxy_before(reply) as proxy:
        before = _tokens(proxy)
        client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
        completion = client.chat.completions.with_raw_response.create(**CHAT)  # type: ignore[call-overload]
        assert completion.http_response.content == plain
        assert "content-encoding" not in completion.headers
        assert completion.parse().choices[0].message.content == "hello"
        stream = client.chat.completions.create(
            **CHAT, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        after = _tokens(proxy)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 1234
    # Both answers' usage reached the token bookkeeping: 2 x 1234 prompt, 2 x 567 completion.
    assert after["prompt"] - before.get("prompt", 0) == 2 * 1234
    assert after["completion"] - before.get("completion", 0) == 2 * 567


@pytest.mark.parametrize(
    ("body", "encoding", "words"),
    [
        (gzip.compress(b"0" * (20 * MB)), "gzip", "max_upstream_body_size"),  # a gzip bomb
        (gzip.compress(_chat_answer())[:-12], "gzip", "gzip body cut short"),
        (b"\x1f\x8b\x08\x00garbage, not deflate", "gzip", "corrupt gzip"),
        (b"(\xb5/\xfd", "zstd", "does not decode (zstd)"),
    ],
    ids=["bomb", "cut-short", "corrupt", "unknown-encoding"],
)
def test_a_gzip_bomb_or_a_corrupt_body_is_a_bounded_502(
    body: bytes, encoding: str, words: str
) -> None:
    async def reply(conversation: Conversation) -> None:
        await conversation.send(answer(body, JSON, f"content-encoding: {encoding}"))

    with _proxy_before(reply, max_upstream_body_size="1MiB") as proxy:
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=30)
        streamed = httpx.post(
            f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=30
        )
    for shaped in (response, streamed):  # a JSON answer to a stream is read whole too
        assert shaped.status_code == 502
        error = shaped.json()["error"]
        assert error["code"] == "upstream_error" and words in error["message"]


def test_a_corrupt_gzip_stream_ends_with_an_error_event() -> None:
    async def reply(conversation: Conversation) -> None:
        packed = gzip.compress(b"".join(_events(100_000)))
        head = f"HTTP/1.1 200 OK\r\n{SSE}\r\ncontent-encoding: gzip\r\n"
        await conversation.send(head.encode() + b"transfer-encoding: chunked\r\n\r\n")
        await conversation.send(chunked(packed[:2000], b"not gzip at all" * 100))
        await conversation.send(b"0\r\n\r\n")

    with (
        _proxy_before(reply) as proxy,
        httpx.stream(
            "POST", f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}
        ) as response,
    ):
        text = response.read().decode()
    assert response.status_code == 200
    assert text.rstrip().endswith('"code":"stream_error"}}')


# --- errors that are not JSON ---------------------------------------------------------


def _not_an_llm_api(
    status: str, content_type: str = "text/plain", body: bytes | None = None
) -> Callable[..., Any]:
    if body is None:
        body = b"404 page not found" if status.startswith("404") else b"<html>nope</html>"

    async def reply(conversation: Conversation) -> None:
        await conversation.send(answer(body, f"content-type: {content_type}", status=status))

    return reply


def test_a_non_json_404_is_a_502_naming_the_deployment_and_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with ScriptedUpstream(_not_an_llm_api("404 Not Found")) as upstream:
        with (
            caplog.at_level(logging.WARNING),
            ProxyInThread(settings_from(_config(upstream.url))) as proxy,
        ):
            client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(**CHAT)
        url = f"{upstream.url}/chat/completions"
    assert raised.value.status_code == 502
    error = raised.value.response.json()["error"]
    assert error["code"] == "upstream_error" and error["type"] == "api_error"
    assert "'d'" in error["message"] and url in error["message"]
    assert "/v1" in error["message"]  # says what to check
    assert url in caplog.text and SECRET not in caplog.text
    assert SECRET not in raised.value.response.text


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        ("301 Moved Permanently", "text/html", None),
        ("405 Method Not Allowed", "text/html", None),
        ("404 Not Found", "application/json", b'{"detail":"Not Found"}'),  # vLLM without /v1
    ],
    ids=["redirect", "method", "fastapi-404"],
)
def test_other_answers_of_no_llm_api_are_502s(
    status: str, content_type: str, body: bytes | None
) -> None:
    with _proxy_before(_not_an_llm_api(status, content_type, body)) as proxy:
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"


def test_a_non_json_answer_about_the_request_keeps_its_status_in_the_contracts_shape() -> None:
    """nginx's 413 in front of an upstream: the client's body was too large there."""
    with _proxy_before(_not_an_llm_api("413 Request Entity Too Large", "text/html")) as proxy:
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "'d'" in error["message"]
    assert "<html>" not in response.text


def test_a_deployment_that_is_no_llm_api_is_passed_over_for_one_that_is() -> None:
    async def good(conversation: Conversation) -> None:
        await conversation.send(answer(_chat_answer(), JSON))

    with (
        ScriptedUpstream(_not_an_llm_api("404 Not Found")) as wrong,
        ScriptedUpstream(good) as right,
    ):
        deployments = [
            {"id": "wrong", "base_url": wrong.url, "weight": 1000},
            {"id": "right", "base_url": right.url, "weight": 1},
        ]
        config = {
            "models": [{"name": "m", "deployments": deployments}],
            "routing": {"strategy": "weighted-random", "retries": 1},
        }
        with ProxyInThread(settings_from(config)) as proxy:
            answers = [
                httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT) for _ in range(3)
            ]
        assert [a.status_code for a in answers] == [200] * 3
        assert len(wrong.requests) == 1  # then cooled: misconfigured, as an Azure 404 is


def test_a_stream_in_an_encoding_the_proxy_cannot_decode_is_a_502_before_it_starts() -> None:
    async def reply(conversation: Conversation) -> None:
        body = b"data: compressed, supposedly\n\n"
        await conversation.send(answer(body, SSE, "content-encoding: br"))

    with _proxy_before(reply) as proxy:
        response = httpx.post(
            f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=30
        )
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_error" and "does not decode (br)" in error["message"]


def test_a_gzipped_answers_usage_corrects_the_keys_token_budget() -> None:
    """The key is charged the answer's real usage (1801 tokens), read from the decoded
    body, not its estimate: what its second answer says is left dropped by exactly
    that much from what its first said (a 30-day window: no refill to speak of)."""

    async def reply(conversation: Conversation) -> None:
        await conversation.send(
            answer(gzip.compress(_chat_answer()), JSON, "content-encoding: gzip")
        )

    with ScriptedUpstream(reply) as upstream:
        config = _config(upstream.url)
        key = {
            "name": "k",
            "key": "sk-client-key-0123",
            "limits": [{"tokens": 10**6, "per": "30d"}],
        }
        config["keys"] = [key]
        with ProxyInThread(settings_from(config)) as proxy:
            left = []
            for _ in range(2):
                response = httpx.post(
                    f"{proxy.base_url}/chat/completions",
                    json=CHAT,
                    headers={"authorization": f"Bearer {key['key']}"},
                )
                assert response.status_code == 200
                left.append(int(response.headers["x-ratelimit-remaining-tokens"]))
                proxy.settled()
    assert left[0] - left[1] == pytest.approx(USAGE["total_tokens"], abs=2)
