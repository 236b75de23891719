"""The fake upstream over real HTTP: shapes, streaming, the sliding-window limit, faults."""

from __future__ import annotations

import asyncio
import base64
import math
import re
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello there, fake!"}]}
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:([\d.]+)s)?(?:([\d.]+)ms)?$")


def parse_duration(text: str) -> float:
    """OpenAI's reset header format back to seconds (`6m0s`, `1.5s`, `120ms`)."""
    match = DURATION.match(text)
    assert match is not None and text, f"not an OpenAI duration: {text!r}"
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


@pytest.fixture
def client(upstream: FakeUpstreamHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=upstream.base_url, timeout=5) as http:
        yield http


def assert_openai_error(response: httpx.Response, status: int, type_: str, code: Any) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_
    assert error["code"] == code
    assert error["message"]


# ------------------------------------------------------------------ endpoint shapes


def test_chat_completion_shape(client: httpx.Client) -> None:
    response = client.post("/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["id"] == response.headers["x-request-id"]
    assert body["model"] == "gpt-4o-mini"
    assert isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 16
    usage = body["usage"]
    # ceil(18 chars / 4) + 3 per message + 3
    assert usage["prompt_tokens"] == 5 + 3 + 3
    assert usage["completion_tokens"] == 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + 16


def test_max_tokens_caps_the_completion(client: httpx.Client) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        body = client.post("/chat/completions", json={**CHAT, field: 4}).json()
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["finish_reason"] == "length"
    body = client.post("/chat/completions", json={**CHAT, "max_tokens": 100}).json()
    assert body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_without_usage(upstream: FakeUpstreamHandle, client: httpx.Client) -> None:
    upstream.control(stream_chunks=5)
    with client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 1 + 5 + 1  # role, content deltas, finish
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 6
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    plain = client.post("/chat/completions", json=CHAT).json()
    assert streamed == plain["choices"][0]["message"]["content"]


def test_chat_stream_usage_chunk_only_with_include_usage(client: httpx.Client) -> None:
    request = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/chat/completions", json=request) as response:
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 1 + 8 + 1 + 1
    *others, last = chunks
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 16
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 16
    assert all(c["usage"] is None for c in others)


def test_stream_chunks_are_flushed_one_by_one(upstream: FakeUpstreamHandle) -> None:
    upstream.control(stream_chunks=2, chunk_delay=0.1)
    arrivals: list[float] = []
    with (
        httpx.Client(base_url=upstream.base_url) as http,
        http.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        start = time.monotonic()
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 5  # role, 2 deltas, finish, [DONE]
    assert arrivals[0] < 0.09  # the first event did not wait for the others
    assert arrivals[3] - arrivals[0] >= 0.25  # three delays between role and finish


def test_completions_shape_and_stream(client: httpx.Client) -> None:
    request = {"model": "gpt-3.5-turbo-instruct", "prompt": "Say this is a test", "max_tokens": 7}
    body = client.post("/completions", json=request).json()
    assert body["object"] == "text_completion"
    assert body["model"] == "gpt-3.5-turbo-instruct"
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"].split()) == 7
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/completions", json=streamed) as response:
        payloads = sse_payloads(response)
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert payloads[-1] == "[DONE]"
    assert len(chunks) == 8 + 1 + 1
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == body["choices"][0]["text"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == body["usage"]


def test_embeddings_shape(client: httpx.Client) -> None:
    request = {"model": "text-embedding-3-small", "input": ["first text", "second"]}
    body = client.post("/embeddings", json=request).json()
    assert body["object"] == "list"
    assert body["model"] == "text-embedding-3-small"
    assert [item["index"] for item in body["data"]] == [0, 1]
    first = body["data"][0]["embedding"]
    assert len(first) == 8
    assert math.isclose(math.fsum(v * v for v in first), 1.0)
    assert body["usage"] == {"prompt_tokens": 3 + 2, "total_tokens": 3 + 2}
    again = client.post("/embeddings", json={**request, "input": "first text"}).json()
    assert again["data"][0]["embedding"] == first  # deterministic from the input
    sized = client.post("/embeddings", json={**request, "dimensions": 3}).json()
    assert len(sized["data"][0]["embedding"]) == 3
    packed = client.post("/embeddings", json={**request, "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert struct.unpack("<8f", raw) == pytest.approx(first, abs=1e-6)


def test_models(client: httpx.Client) -> None:
    body = client.get("/models").json()
    assert body["object"] == "list"
    assert "gpt-4o-mini" in [model["id"] for model in body["data"]]
    assert all(model["object"] == "model" for model in body["data"])


def test_openai_sdk_plain_streamed_and_embeddings(upstream: FakeUpstreamHandle) -> None:
    sdk = openai.OpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0)
    completion = sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert completion.model == "gpt-4o-mini"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.choices[0].message.content

    stream = sdk.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 16

    # The SDK asks for base64 embeddings by default and decodes them itself.
    vectors = sdk.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [len(item.embedding) for item in vectors.data] == [8, 8]
    assert "gpt-4o-mini" in [model.id for model in sdk.models.list()]
    legacy = sdk.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=3)
    assert legacy.usage is not None and legacy.usage.completion_tokens == 3


# ------------------------------------------------------------------ errors and auth


def test_bad_bodies_are_openai_shaped_400s(client: httpx.Client) -> None:
    cases: list[bytes] = [
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"messages": CHAT["messages"]}),  # no model
        orjson.dumps({"model": "m"}),  # no messages
        orjson.dumps({**CHAT, "max_tokens": "lots"}),
    ]
    for content in cases:
        response = client.post("/chat/completions", content=content)
        assert_openai_error(response, 400, "invalid_request_error", None)
    response = client.post("/embeddings", json={"model": "m", "input": 42})
    assert_openai_error(response, 400, "invalid_request_error", None)
    assert_openai_error(client.get("/nowhere"), 404, "invalid_request_error", None)


def test_api_key_is_enforced(upstream: FakeUpstreamHandle, client: httpx.Client) -> None:
    upstream.control(api_key="sk-right")
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        response = client.post("/chat/completions", json=CHAT, headers=headers)
        assert_openai_error(response, 401, "invalid_request_error", "invalid_api_key")
    assert client.get("/models").status_code == 401
    ok = client.post("/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-right"})
    assert ok.status_code == 200


# ------------------------------------------------------------------ rate limit


def test_sliding_window_rejects_the_request_over_the_limit() -> None:
    config = FakeUpstreamConfig(port=0, rpm=5, window=0.5)
    with run_in_thread(config) as upstream, httpx.Client(base_url=upstream.base_url) as http:
        remaining = []
        for _ in range(5):
            response = http.post("/chat/completions", json=CHAT)
            assert response.status_code == 200
            # Announced per minute, as OpenAI does: 5 per 0.5 s is 600 per minute.
            assert response.headers["x-ratelimit-limit-requests"] == "600"
            remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
            assert 0 < parse_duration(response.headers["x-ratelimit-reset-requests"]) <= 0.5
        assert remaining == [4, 3, 2, 1, 0]

        rejected = http.post("/chat/completions", json=CHAT)
        assert_openai_error(rejected, 429, "requests", "rate_limit_exceeded")
        headers = rejected.headers
        assert headers["x-ratelimit-limit-requests"] == "600"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert 0 < parse_duration(headers["x-ratelimit-reset-requests"]) <= 0.5
        assert headers["retry-after"] == "1"  # 0 < wait <= 0.5 s, rounded up
        wait_ms = int(headers["retry-after-ms"])
        assert 0 < wait_ms <= 500

        # A rejection takes no budget: the next request is rejected as well.
        assert http.post("/chat/completions", json=CHAT).status_code == 429
        time.sleep(wait_ms / 1000 + 0.02)
        assert http.post("/chat/completions", json=CHAT).status_code == 200
        stats = upstream.stats()
    assert stats["rejected"] == 2
    assert stats["served"] == 6
    assert stats["peak_window_requests"] == 5
    assert stats["by_status"] == {"200": 6, "429": 2}


def test_token_limit_counts_prompt_plus_max_tokens(
    client: httpx.Client, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(tpm=50, rpm=100)
    request = {**CHAT, "max_tokens": 14}  # costs 11 prompt + 14 = 25 tokens
    first = client.post("/chat/completions", json=request)
    assert first.headers["x-ratelimit-remaining-tokens"] == "25"
    assert client.post("/chat/completions", json=request).status_code == 200
    rejected = client.post("/chat/completions", json=request)
    assert_openai_error(rejected, 429, "tokens", "rate_limit_exceeded")
    assert rejected.headers["x-ratelimit-limit-tokens"] == "50"
    assert rejected.headers["x-ratelimit-remaining-tokens"] == "0"
    assert rejected.headers["x-ratelimit-remaining-requests"] == "98"
    assert int(rejected.headers["retry-after"]) == 60
    too_large = client.post("/chat/completions", json={**CHAT, "max_tokens": 100})
    assert_openai_error(too_large, 429, "tokens", "rate_limit_exceeded")
    assert "too large" in too_large.json()["error"]["message"]


def test_a_quantum_enforces_the_limits_pro_rata_over_shorter_spans(
    client: httpx.Client, upstream: FakeUpstreamHandle
) -> None:
    # 600 tokens a minute, and so at most 50 in any 5 s: the second 25 fits, a third not.
    upstream.control(tpm=600, rpm=600, window=60, quantum=5)
    request = {**CHAT, "max_tokens": 14}  # 25 tokens
    assert [client.post("/chat/completions", json=request).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    assert upstream.stats()["rejected"] == 1


def test_rate_limit_headers_can_be_withheld(
    client: httpx.Client, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(rpm=1, window=60, ratelimit_headers=False)
    accepted = client.post("/chat/completions", json=CHAT)
    rejected = client.post("/chat/completions", json=CHAT)
    assert accepted.status_code == 200 and rejected.status_code == 429
    for response in (accepted, rejected):
        assert not [h for h in response.headers if h.startswith("x-ratelimit-")]
    assert int(rejected.headers["retry-after"]) == 60 and rejected.headers["retry-after-ms"]


# ------------------------------------------------------------------ failure injection


def test_fail_rate_answers_the_configured_status(
    upstream: FakeUpstreamHandle, client: httpx.Client
) -> None:
    upstream.control(fail_rate=1.0, fail_status=503, rpm=10)
    response = client.post("/chat/completions", json=CHAT)
    assert_openai_error(response, 503, "server_error", None)
    assert response.headers["x-ratelimit-remaining-requests"] == "9"  # it took budget
    assert upstream.stats()["failed"] == 1


def test_seeded_faults_are_reproducible() -> None:
    def statuses() -> list[int]:
        config = FakeUpstreamConfig(port=0, fail_rate=0.5, seed=7)
        with run_in_thread(config) as upstream, httpx.Client(base_url=upstream.base_url) as h:
            return [h.post("/chat/completions", json=CHAT).status_code for _ in range(20)]

    first = statuses()
    assert first == statuses()
    assert {200, 500} == set(first)


def test_drop_closes_the_connection_without_answer(
    upstream: FakeUpstreamHandle, client: httpx.Client
) -> None:
    upstream.control(drop_rate=1.0)
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/chat/completions", json=CHAT)
    upstream.control(drop_rate=0.0)
    assert client.post("/chat/completions", json=CHAT).status_code == 200
    stats = upstream.stats()
    assert stats["dropped"] == 1
    assert stats["by_status"] == {"200": 1}


def test_hang_never_answers_and_ends_when_the_client_leaves(
    upstream: FakeUpstreamHandle,
) -> None:
    upstream.control(hang_rate=1.0)
    with (
        httpx.Client(base_url=upstream.base_url, timeout=0.2) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post("/chat/completions", json=CHAT)
    assert upstream.stats()["hung"] == 1
    wait_until(lambda: upstream.stats()["in_flight"] == 0)
    assert upstream.stats()["client_disconnects"] == 0  # a hang is not counted twice


def test_fail_after_chunks_cuts_the_stream(
    upstream: FakeUpstreamHandle, client: httpx.Client
) -> None:
    upstream.control(fail_after_chunks=3)
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line)
    assert len(received) == 3
    stats = upstream.stats()
    assert stats["streams_cut"] == 1
    assert stats["served"] == 0


def test_client_leaving_mid_stream_is_counted(upstream: FakeUpstreamHandle) -> None:
    upstream.control(chunk_delay=0.05)
    with (
        httpx.Client(base_url=upstream.base_url) as http,
        http.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        next(response.iter_lines())
    wait_until(lambda: upstream.stats()["client_disconnects"] == 1)
    assert upstream.stats()["in_flight"] == 0


# ------------------------------------------------------------------ latency, stats, control


def test_latency_and_concurrency(upstream: FakeUpstreamHandle) -> None:
    upstream.control(latency=0.1)

    async def burst() -> list[float]:
        async with httpx.AsyncClient(base_url=upstream.base_url) as http:

            async def one() -> float:
                start = time.monotonic()
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 200
                return time.monotonic() - start

            return await asyncio.gather(*(one() for _ in range(10)))

    durations = asyncio.run(burst())
    assert min(durations) >= 0.1
    assert upstream.stats()["max_in_flight"] == 10


def test_stats_last_request_and_reset(upstream: FakeUpstreamHandle, client: httpx.Client) -> None:
    client.post("/chat/completions", json=CHAT, headers={"X-Custom": "yes"})
    client.post("/chat/completions", content=b"oops")
    stats = client.get(upstream.url + "/stats").json()
    assert stats["requests"] == 2
    assert stats["served"] == 1
    assert stats["by_status"] == {"200": 1, "400": 1}
    assert stats["tokens_served"] == 11 + 16
    assert stats["in_flight"] == 0
    client.post("/chat/completions", json={**CHAT, "model": "rewritten"}, headers={"X-A": "b"})
    last = upstream.stats()["last_request"]
    assert last["method"] == "POST"
    assert last["path"] == "/v1/chat/completions"
    assert last["model"] == "rewritten"
    assert last["headers"]["x-a"] == "b"
    assert "x-custom" not in last["headers"]
    assert all(name == name.lower() for name in last["headers"])

    reset = client.post(upstream.url + "/stats/reset").json()
    assert reset["requests"] == 0
    assert reset["by_status"] == {}
    assert reset["peak_window_requests"] == 0
    assert reset["last_request"] is None


def test_control_api(upstream: FakeUpstreamHandle, client: httpx.Client) -> None:
    options = client.post(upstream.url + "/control", json={"rpm": 1, "latency": "0-0.01"})
    assert options.status_code == 200
    assert options.json()["rpm"] == 1
    assert options.json()["latency"] == [0.0, 0.01]
    assert client.get(upstream.url + "/control").json()["rpm"] == 1
    assert client.post("/chat/completions", json=CHAT).status_code == 200
    assert client.post("/chat/completions", json=CHAT).status_code == 429

    for bad in ({"nope": 1}, {"port": 9}, {"fail_rate": 2}, {"rpm": "x"}, {"latency": "a-b"}):
        response = client.post(upstream.url + "/control", json=bad)
        assert_openai_error(response, 400, "invalid_request_error", "invalid_option")
    assert client.post(upstream.url + "/control", content=b"[]").status_code == 400

    assert upstream.control(rpm=None)["rpm"] is None
    with pytest.raises(ValueError, match="unknown"):
        upstream.control(nope=1)


def test_handle_lifecycle() -> None:
    handle = run_in_thread(FakeUpstreamConfig(port=0))
    assert handle.url == f"http://127.0.0.1:{handle.port}"
    assert handle.base_url == handle.url + "/v1"
    assert httpx.get(handle.base_url + "/models").status_code == 200
    handle.stop()
    assert handle.stats()["requests"] == 1  # still readable after stop
    with pytest.raises(httpx.ConnectError):
        httpx.get(handle.base_url + "/models")


def wait_until(condition: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_error_after_chunks_ends_a_chat_stream_with_an_error_chunk(
    upstream: FakeUpstreamHandle,
) -> None:
    upstream.control(error_after_chunks=2)
    sdk = openai.OpenAI(base_url=upstream.base_url, api_key="x", max_retries=0)
    stream = sdk.chat.completions.create(
        model="gpt-4o-mini", messages=CHAT["messages"], stream=True
    )
    with pytest.raises(openai.APIError, match="server had an error"):
        list(stream)
    assert upstream.stats()["streams_errored"] == 1
