"""The proxy as a user sees it: the official OpenAI SDK against a real proxy in front of
the real fake upstream, over HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, free_port, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

UPSTREAM_KEY = "sk-upstream-secret-a"
TEAM_A = "sk-team-a"
TEAM_B = "sk-team-b"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(
        FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    ) as handle:
        yield handle


def _config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "keys": [
            {"name": "team-a", "key": TEAM_A},
            {
                "name": "team-b",
                "key_sha256": hashlib.sha256(TEAM_B.encode()).hexdigest(),
                "models": ["gpt-4o-mini"],
            },
        ],
        "models": [
            {
                "name": "gpt-4o-mini",
                "deployments": [
                    {
                        "id": "fake-a",
                        "base_url": f"{upstream_url}/v1",
                        "api_key": UPSTREAM_KEY,
                        "model": "upstream-mini",
                        "timeout": "2s",
                    }
                ],
            },
            {
                "name": "text-embedding-3-small",
                "deployments": [
                    {"id": "fake-emb", "base_url": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY}
                ],
            },
            {
                "name": "refused",
                "deployments": [
                    {
                        "id": "nowhere",
                        "base_url": f"http://127.0.0.1:{free_port()}/v1",
                        "timeout": "2s",
                    }
                ],
            },
        ],
        # These tests inject failures to check how they map to errors, not cooldowns.
        "routing": {"retries": 0, "cooldown": {"allowed_fails": 1000}},
        "server": {"max_body_size": "64KiB"},
    }
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(_config(upstream.url))) as server:
        yield server


@pytest.fixture
def client(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=TEAM_A, max_retries=0)


def _post(proxy: ProxyInThread, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {TEAM_A}", **kwargs.pop("headers", {})}
    return httpx.post(f"{proxy.base_url}{path}", headers=headers, timeout=10, **kwargs)


def _stream(proxy: ProxyInThread) -> AbstractContextManager[httpx.Response]:
    """A streamed chat completion of key A, read as it arrives."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "stream": True}
    headers = {"authorization": f"Bearer {TEAM_A}"}
    url = f"{proxy.base_url}/chat/completions"
    return httpx.stream("POST", url, json=body, headers=headers, timeout=10)


def _assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers.get("x-request-id")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


# --- the happy paths ----------------------------------------------------------------


def test_chat_completion_through_the_sdk(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hi"}]
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.total_tokens > 0


def test_streamed_chat_completion_through_the_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Count"}], stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # The proxy asked the upstream for usage to settle budgets; the client did not ask,
    # so the usage-only chunk is not passed on.
    assert all(c.choices for c in chunks)


def test_stream_with_usage_requested_keeps_the_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_completions_embeddings_and_models(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="gpt-4o-mini", prompt="Once upon", max_tokens=5)
    assert completion.choices[0].text
    embedding = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(embedding.data) == 2
    models = {m.id for m in client.models.list()}
    assert models == {"gpt-4o-mini", "text-embedding-3-small", "refused"}


def test_a_model_is_retrieved_by_name(proxy: ProxyInThread, client: openai.OpenAI) -> None:
    model = client.models.retrieve("gpt-4o-mini")
    assert model.id == "gpt-4o-mini" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-99")
    team_b = openai.OpenAI(base_url=proxy.base_url, api_key=TEAM_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):  # not on its allow-list: not its to see
        team_b.models.retrieve("refused")


def test_a_trailing_slash_is_served_as_the_canonical_path(proxy: ProxyInThread) -> None:
    """Never a redirect with an empty body (which would lose a POST)."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    answer = _post(proxy, "/chat/completions/", json=body)
    assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"
    headers = {"authorization": f"Bearer {TEAM_A}"}
    models = httpx.get(f"{proxy.base_url}/models/", headers=headers, timeout=10)
    assert models.status_code == 200 and models.json()["object"] == "list"


def test_models_are_filtered_by_the_keys_allow_list(proxy: ProxyInThread) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TEAM_B, max_retries=0)
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]


def test_upstream_sees_its_own_key_and_model_never_the_clients(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    response = _post(
        proxy,
        "/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
        headers={"connection": "keep-alive", "x-custom": "kept", "cookie": "session=1"},
    )
    assert response.status_code == 200
    seen = upstream.stats()["last_request"]
    assert seen["model"] == "upstream-mini"
    assert seen["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert TEAM_A not in str(seen["headers"])
    assert "cookie" not in seen["headers"]
    assert seen["headers"]["x-custom"] == "kept"
    assert response.headers["x-request-id"].startswith("req_")
    assert UPSTREAM_KEY not in response.text and UPSTREAM_KEY not in str(response.headers)


@pytest.mark.slow
def test_first_chunk_arrives_while_the_upstream_is_still_generating(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(stream_chunks=6, chunk_delay=0.3)
    try:
        with _stream(proxy) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            chunks = r.iter_raw()
            first = next(chunks)
            assert first.startswith(b"data: ")
            # The upstream has not finished: the chunk was passed through, not buffered.
            assert upstream.stats()["in_flight"] == 1
            rest = b"".join(chunks)
        assert rest.endswith(b"data: [DONE]\n\n")
    finally:
        upstream.control(stream_chunks=8, chunk_delay=0.001)


def test_client_disconnect_mid_stream_closes_the_upstream_request(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(stream_chunks=50, chunk_delay=0.2)
    try:
        with _stream(proxy) as r:
            chunks = r.iter_raw()  # keep a reference: a dropped iterator closes the stream
            next(chunks)
            assert upstream.stats()["in_flight"] == 1
        # The client is gone; the proxy must hang up on the upstream long before the
        # 50 chunks (10 s) would have finished.
        deadline = time.monotonic() + 5
        while upstream.stats()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert upstream.stats()["in_flight"] == 0
    finally:
        upstream.control(stream_chunks=8, chunk_delay=0.001)


def test_health_endpoints(proxy: ProxyInThread) -> None:
    assert httpx.get(f"{proxy.url}/health/live").status_code == 200
    ready = httpx.get(f"{proxy.url}/health/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


# --- the error contract ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_body"),
        (b'"text"', "invalid_body"),
        (b"{}", "missing_model"),
        (b'{"model": 42}', "missing_model"),
        (b"", "invalid_json"),
    ],
)
def test_bad_bodies_are_400(proxy: ProxyInThread, content: bytes, code: str) -> None:
    response = _post(
        proxy, "/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    _assert_error(response, 400, code)


def test_unknown_model_is_404(proxy: ProxyInThread) -> None:
    response = _post(proxy, "/chat/completions", json={"model": "gpt-99", "messages": []})
    error = _assert_error(response, 404, "model_not_found")
    assert error["param"] == "model"


def test_wrong_content_type_is_415(proxy: ProxyInThread) -> None:
    response = _post(
        proxy,
        "/chat/completions",
        content=b"model=x",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    _assert_error(response, 415)


def test_body_over_the_limit_is_413(proxy: ProxyInThread) -> None:
    big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 70_000}]}
    _assert_error(_post(proxy, "/chat/completions", json=big), 413, "request_too_large")


def test_bad_keys_are_401_and_forbidden_models_403(proxy: ProxyInThread) -> None:
    body = {"model": "gpt-4o-mini", "messages": []}
    _assert_error(
        _post(proxy, "/chat/completions", json=body, headers={"authorization": "Bearer nope"}), 401
    )
    no_auth = httpx.post(f"{proxy.base_url}/chat/completions", json=body)
    _assert_error(no_auth, 401, "missing_api_key")
    team_b = {"authorization": f"Bearer {TEAM_B}"}
    _assert_error(
        _post(
            proxy,
            "/embeddings",
            json={"model": "text-embedding-3-small", "input": "x"},
            headers=team_b,
        ),
        403,
    )


def test_sdk_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[])
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="gpt-4o-mini", messages=[])


def test_unknown_paths_and_methods_are_openai_shaped(proxy: ProxyInThread) -> None:
    _assert_json_error(httpx.get(f"{proxy.base_url}/nope"), 404)
    _assert_json_error(httpx.get(f"{proxy.base_url}/chat/completions"), 405)


def _assert_json_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_connection_refused_is_502(proxy: ProxyInThread) -> None:
    response = _post(proxy, "/chat/completions", json={"model": "refused", "messages": []})
    error = _assert_error(response, 502, "upstream_connection_error")
    assert "127.0.0.1" not in error["message"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("option", "status"),
    [("hang_rate", 504), ("drop_rate", 502), ("fail_rate", 502)],
)
def test_upstream_trouble_maps_to_5xx(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle, option: str, status: int
) -> None:
    upstream.control(**{option: 1.0})
    try:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
        response = _post(proxy, "/chat/completions", json=body)
        _assert_error(response, status)
        assert UPSTREAM_KEY not in response.text
    finally:
        upstream.control(**{option: 0.0})


def test_upstream_client_errors_pass_through(proxy: ProxyInThread) -> None:
    # The fake answers 400 to a body it cannot use, as OpenAI does; that is the
    # client's own mistake and reaches it unchanged.
    response = _post(proxy, "/chat/completions", json={"model": "gpt-4o-mini", "messages": "oops"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_the_async_sdk_chats_streams_and_gets_typed_errors(proxy: ProxyInThread) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key=TEAM_A, max_retries=0)
    completion = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    embedding = await client.embeddings.create(model="text-embedding-3-small", input="x")
    assert embedding.data[0].embedding
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=[])
    with pytest.raises(openai.PermissionDeniedError):
        forbidden = openai.AsyncOpenAI(base_url=proxy.base_url, api_key=TEAM_B, max_retries=0)
        await forbidden.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="refused", messages=[])
    assert info.value.status_code == 502
    await client.close()
