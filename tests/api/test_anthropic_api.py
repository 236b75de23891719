"""Anthropic's Messages API as a user sees it: the official anthropic SDK against a real
proxy in front of the fake upstream's Messages API, over HTTP on 127.0.0.1. The client's
key as x-api-key or bearer, the deployment's key (and never the client's) upstream,
Anthropic-shaped errors everywhere on this surface, the key's limits as
anthropic-ratelimit-* headers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_client import read_answer

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

UPSTREAM_KEY = "sk-ant-upstream-secret"
CLIENT = "sk-client-claude"
LIMITED = "sk-client-limited"
GPT_ONLY = "sk-client-gpt-only"
METERED = "sk-client-metered"
CACHED = "sk-client-cached"
MESSAGES: list[Any] = [{"role": "user", "content": "Hello there, fake!"}]
BODY = {"model": "claude", "max_tokens": 100, "messages": MESSAGES}
BODY_TIMEOUT = 1.0

pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(autouse=True)
def _fresh(upstream: FakeUpstreamHandle) -> None:
    upstream.control(fail_rate=0.0, fail_status=500, cache_read_tokens=0, cache_write_tokens=0)


def _config(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "keys": [
            {"name": "app", "key": CLIENT, "limits": [{"tokens": 100_000, "per": "1d"}]},
            {"name": "limited", "key": LIMITED, "rpm": 2},
            {"name": "gpt-only", "key": GPT_ONLY, "models": ["gpt"]},
            {"name": "cached", "key": CACHED, "limits": [{"input_tokens": 100_000, "per": "1d"}]},
            {
                "name": "metered",
                "key": METERED,
                "limits": [
                    {"tokens": 100_000, "per": "1d"},
                    {"input_tokens": 100_000, "per": "1d"},
                    {"output_tokens": 100_000, "per": "1d"},
                ],
            },
        ],
        "models": [
            {
                "name": "claude",
                "deployments": [
                    {
                        "id": "anthropic-a",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": UPSTREAM_KEY,
                        "model": "claude-upstream",
                    }
                ],
            },
            {
                "name": "claude-bad-key",
                "deployments": [
                    {
                        "id": "anthropic-bad-key",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": "sk-ant-revoked",
                    }
                ],
            },
            {
                "name": "gpt",
                "deployments": [{"id": "openai-a", "base_url": upstream.base_url}],
            },
        ],
        "routing": {"retries": 0, "cooldown": {"allowed_fails": 1000}},
        "server": {"max_body_size": "64KiB", "body_timeout": f"{BODY_TIMEOUT}s"},
    }


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(_config(upstream))) as server:
        yield server


@pytest.fixture
def client(proxy: ProxyInThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT, max_retries=0)


def _post(proxy: ProxyInThread, path: str, key: str = CLIENT, **kwargs: Any) -> httpx.Response:
    headers = {"x-api-key": key, **kwargs.pop("headers", {})}
    return httpx.post(f"{proxy.url}{path}", headers=headers, timeout=10, **kwargs)


def _anthropic_error(response: httpx.Response, status: int, type_: str) -> str:
    """The answer is Anthropic's error shape, with the proxy's request id."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers.get("x-request-id")
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == type_, body
    return str(body["error"]["message"])


# --- the SDK's calls --------------------------------------------------------------------


def test_a_plain_message_through_the_sdk(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="claude", max_tokens=100, messages=MESSAGES)
    assert message.type == "message" and message.content[0].type == "text"
    assert message.usage.input_tokens == 11 and message.usage.output_tokens == 16


def test_a_streamed_message_through_the_sdk(client: anthropic.Anthropic) -> None:
    stream = client.messages.create(model="claude", max_tokens=100, messages=MESSAGES, stream=True)
    types = [event.type for event in stream]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types


def test_the_stream_helper_assembles_the_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="claude", max_tokens=100, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens == 16


def test_count_tokens_through_the_sdk(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="claude", messages=MESSAGES, system="abcd")
    assert counted.input_tokens == 11 + 1 + 3


def test_the_key_may_come_as_x_api_key_or_bearer(proxy: ProxyInThread) -> None:
    assert _post(proxy, "/v1/messages", json=BODY).status_code == 200
    bearer = httpx.post(
        f"{proxy.url}/v1/messages",
        json=BODY,
        headers={"authorization": f"Bearer {CLIENT}"},
        timeout=10,
    )
    assert bearer.status_code == 200, bearer.text


def test_the_upstream_sees_the_deployments_key_never_the_clients(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    answer = _post(
        proxy,
        "/v1/messages",
        json=BODY,
        headers={"authorization": f"Bearer {CLIENT}", "anthropic-beta": "tools-2024-04-04"},
    )
    assert answer.status_code == 200, answer.text
    seen = upstream.stats()["last_request"]
    assert seen["path"] == "/v1/messages" and seen["model"] == "claude-upstream"
    assert seen["headers"]["x-api-key"] == UPSTREAM_KEY
    assert "authorization" not in seen["headers"]
    assert CLIENT not in str(seen["headers"])
    # No version from the client: Anthropic's long-standing one; its beta passed on.
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert seen["headers"]["anthropic-beta"] == "tools-2024-04-04"
    assert UPSTREAM_KEY not in answer.text and UPSTREAM_KEY not in str(answer.headers)


def test_the_clients_anthropic_version_is_forwarded(
    client: anthropic.Anthropic, upstream: FakeUpstreamHandle
) -> None:
    client.messages.create(model="claude", max_tokens=10, messages=MESSAGES)
    seen = upstream.stats()["last_request"]["headers"]
    assert seen["anthropic-version"] == client.default_headers["anthropic-version"]


def test_the_keys_limits_come_as_anthropic_headers(proxy: ProxyInThread) -> None:
    answer = _post(proxy, "/v1/messages", json=BODY)
    assert int(answer.headers["anthropic-ratelimit-tokens-limit"]) == 100_000
    assert int(answer.headers["anthropic-ratelimit-tokens-remaining"]) < 100_000
    reset = answer.headers["anthropic-ratelimit-tokens-reset"]
    assert datetime.fromisoformat(reset.replace("Z", "+00:00")).tzinfo is not None
    assert not any(name.startswith("x-ratelimit-") for name in answer.headers)


def test_the_sdks_beta_messages_as_claude_code_sends_them(proxy: ProxyInThread) -> None:
    """Claude Code (``ANTHROPIC_BASE_URL`` at the proxy, ``ANTHROPIC_AUTH_TOKEN`` a client
    key) sends the beta client's calls: ``/v1/messages?beta=true`` and its token count,
    with a bearer key."""
    client = anthropic.Anthropic(base_url=proxy.url, auth_token=CLIENT, max_retries=0)
    message = client.beta.messages.create(model="claude", max_tokens=50, messages=MESSAGES)
    assert message.content and message.usage.output_tokens > 0
    counted = client.beta.messages.count_tokens(model="claude", messages=MESSAGES)
    assert counted.input_tokens > 0


def test_the_models_routes_take_the_key_as_anthropic_clients_send_it(
    client: anthropic.Anthropic, proxy: ProxyInThread
) -> None:
    """``GET /v1/models`` with ``x-api-key`` (the Anthropic SDK, Claude Code): the key
    is taken in either form a served API takes, on every client route, its allow-list
    applied as for a bearer key."""
    assert {model.id for model in client.models.list()} >= {"claude", "gpt"}
    assert client.models.retrieve("claude").id == "claude"
    bearer = anthropic.Anthropic(base_url=proxy.url, auth_token=CLIENT, max_retries=0)
    assert {model.id for model in bearer.models.list()} >= {"claude", "gpt"}
    gpt_only = anthropic.Anthropic(base_url=proxy.url, api_key=GPT_ONLY, max_retries=0)
    assert [model.id for model in gpt_only.models.list()] == ["gpt"]
    with pytest.raises(anthropic.NotFoundError):
        gpt_only.models.retrieve("claude")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="sk-no", max_retries=0).models.list()
    # An OpenAI route and a stored response's route know the key too (403, 404: not 401).
    chat = {"model": "claude", "messages": MESSAGES}
    for method, path, body, key, status in (
        ("POST", "/v1/chat/completions", chat, GPT_ONLY, 403),
        ("GET", "/v1/responses/resp_unknown", None, CLIENT, 404),
    ):
        answer = httpx.request(
            method, f"{proxy.url}{path}", json=body, headers={"x-api-key": key}, timeout=10
        )
        assert answer.status_code == status, answer.text


# --- errors: Anthropic's shape, the OpenAI surface's statuses -------------------------------


def test_a_key_over_its_limit_gets_an_anthropic_429_with_retry_after(
    proxy: ProxyInThread,
) -> None:
    client = anthropic.Anthropic(base_url=proxy.url, api_key=LIMITED, max_retries=0)
    for _ in range(2):
        client.messages.create(model="claude", max_tokens=10, messages=MESSAGES)
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="claude", max_tokens=10, messages=MESSAGES)
    response = refused.value.response
    message = _anthropic_error(response, 429, "rate_limit_error")
    assert "requests per minute" in message
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_a_missing_or_wrong_key_is_an_authentication_error(proxy: ProxyInThread) -> None:
    missing = httpx.post(f"{proxy.url}/v1/messages", json=BODY, timeout=10)
    assert "x-api-key" in _anthropic_error(missing, 401, "authentication_error")
    _anthropic_error(
        _post(proxy, "/v1/messages", key="sk-nobody", json=BODY), 401, "authentication_error"
    )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="sk-no", max_retries=0).messages.create(
            model="claude", max_tokens=10, messages=MESSAGES
        )


def test_a_model_not_on_the_keys_list_is_a_permission_error(proxy: ProxyInThread) -> None:
    _anthropic_error(_post(proxy, "/v1/messages", key=GPT_ONLY, json=BODY), 403, "permission_error")


def test_an_unknown_model_or_path_is_not_found(proxy: ProxyInThread) -> None:
    _anthropic_error(
        _post(proxy, "/v1/messages", json={**BODY, "model": "claude-9"}), 404, "not_found_error"
    )
    _anthropic_error(_post(proxy, "/v1/messages/batches", json=BODY), 404, "not_found_error")
    wrong_method = httpx.get(f"{proxy.url}/v1/messages", headers={"x-api-key": CLIENT})
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"


def _raw(
    method: str = "POST",
    path: str = "/v1/messages",
    *extra: str,
    body: bytes = orjson.dumps(BODY),
    length: int | None = None,
    key: str | None = CLIENT,
) -> bytes:
    """A request as bytes: ``length`` announced (the body's own by default), ``extra``
    header lines as they are."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    lines += [f"x-api-key: {key}"] if key else []
    lines += [f"Content-Length: {len(body) if length is None else length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# Every refusal the proxy makes on this surface, before, while and after the body is read.
REFUSALS = {
    "unparsable-header": (_raw("POST", "/v1/messages", "Bad Header Line"), 400),
    "unparsable-header-absolute-target": (_raw("POST", "http://x/v1/messages", "Bad:\x01"), 400),
    "no-key-before-the-body": (_raw(body=b"{", length=9_000_000, key=None), 401),
    "body-too-large-announced": (_raw(body=b"{", length=9_000_000), 413),
    "body-stops-arriving": (_raw(body=b"{", length=200), 408),
    "header-too-large": (_raw("POST", "/v1/messages", "x-big: " + "a" * 9000), 431),
    "unknown-model": (_raw(body=orjson.dumps({**BODY, "model": "claude-9"})), 404),
    "unknown-path-below": (_raw("POST", "/v1/messages/batches"), 404),
    "wrong-method": (_raw("GET", "/v1/messages", body=b""), 405),
    "wrong-method-with-query": (_raw("GET", "/v1/messages?beta=true", body=b""), 405),
}


@pytest.mark.parametrize(("request_bytes", "status"), REFUSALS.values(), ids=REFUSALS.keys())
def test_every_refusal_on_the_messages_surface_is_anthropic_shaped(
    proxy: ProxyInThread, serving_path: str, request_bytes: bytes, status: int
) -> None:
    """Each status the proxy answers under ``/v1/messages``, sent as raw bytes (what an
    HTTP library will not send: a header line the parser refuses, a body that stops):
    Anthropic's error shape, with the type its status has there."""
    if status == 400 and serving_path != "fast":
        pytest.skip("the proxy's own HTTP protocol only (the portable path is stock uvicorn)")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5 + BODY_TIMEOUT) as conn:
        conn.sendall(request_bytes)
        answer, headers, body = read_answer(conn)
    response = httpx.Response(answer, headers=headers, content=body)
    _anthropic_error(response, status, anthropic_type(status))


def anthropic_type(status: int) -> str:
    """The error type Anthropic's API gives a status (its list; other 4xx: the request's)."""
    return {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(
        status, "invalid_request_error"
    )


def test_max_tokens_is_required_and_named(proxy: ProxyInThread) -> None:
    body = {k: v for k, v in BODY.items() if k != "max_tokens"}
    message = _anthropic_error(
        _post(proxy, "/v1/messages", json=body), 400, "invalid_request_error"
    )
    assert "max_tokens" in message
    bad = _post(proxy, "/v1/messages", json={**BODY, "max_tokens": "many"})
    assert "max_tokens" in _anthropic_error(bad, 400, "invalid_request_error")
    broken = _post(
        proxy, "/v1/messages", content=b"{", headers={"content-type": "application/json"}
    )
    _anthropic_error(broken, 400, "invalid_request_error")


def test_a_model_reached_through_an_api_its_deployments_neither_speak_nor_translate_to(
    proxy: ProxyInThread,
) -> None:
    """Chat completions and the Messages API reach each other's deployments translated
    (tests/api/test_translation.py); a token count reaches no OpenAI deployment, and the
    Responses API no Anthropic one."""
    counted = _post(proxy, "/v1/messages/count_tokens", json={"model": "gpt", "messages": MESSAGES})
    message = _anthropic_error(counted, 400, "invalid_request_error")
    assert "'gpt'" in message and "messages/count_tokens" in message
    responses = httpx.post(
        f"{proxy.url}/v1/responses",
        json={"model": "claude", "input": "hi"},
        headers={"authorization": f"Bearer {CLIENT}"},
        timeout=10,
    )
    assert responses.status_code == 400
    assert responses.json()["error"]["code"] == "unsupported_api"


def test_a_body_over_the_limit_is_anthropic_shaped(proxy: ProxyInThread) -> None:
    huge = {**BODY, "messages": [{"role": "user", "content": "x" * 100_000}]}
    _anthropic_error(_post(proxy, "/v1/messages", json=huge), 413, "request_too_large")


def test_an_overloaded_upstream_is_an_overloaded_error(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(fail_rate=1.0, fail_status=529)
    answer = _post(proxy, "/v1/messages", json=BODY)
    _anthropic_error(answer, 503, "overloaded_error")


def test_upstream_request_errors_pass_through_as_they_are(
    proxy: ProxyInThread,
) -> None:
    """A message the upstream refuses (here: no messages) is its own answer."""
    answer = _post(proxy, "/v1/messages", json={"model": "claude", "max_tokens": 5})
    message = _anthropic_error(answer, 400, "invalid_request_error")
    assert message.startswith("messages:")  # the fake's words, not the proxy's
    assert answer.json()["request_id"].startswith("req_")


def test_the_keys_token_window_ends_at_the_real_usage(
    proxy: ProxyInThread, client: anthropic.Anthropic
) -> None:
    """Each message is estimated at 12 input + 100 max_tokens; it used 11 + 16. After a
    plain and a streamed one, a third shows each window (tokens, input, output) holding
    their real usage and its own estimate (a day's window refills about one token a
    second meanwhile)."""
    metered = anthropic.Anthropic(base_url=proxy.url, api_key=METERED, max_retries=0)
    metered.messages.create(model="claude", max_tokens=100, messages=MESSAGES)
    with metered.messages.stream(model="claude", max_tokens=100, messages=MESSAGES) as stream:
        stream.get_final_message()
    proxy.settled()
    third = _post(proxy, "/v1/messages", key=METERED, json=BODY)

    def used(kind: str) -> int:
        return 100_000 - int(third.headers[f"anthropic-ratelimit-{kind}-remaining"])

    assert 2 * (11 + 16) + 112 - 10 <= used("tokens") <= 2 * (11 + 16) + 112
    assert 2 * 11 + 12 - 10 <= used("input-tokens") <= 2 * 11 + 12
    assert 2 * 16 + 100 - 10 <= used("output-tokens") <= 2 * 16 + 100


def test_a_stream_broken_off_upstream_ends_with_an_error_event(
    client: anthropic.Anthropic, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(fail_after_chunks=4)
    try:
        with (
            pytest.raises(anthropic.APIStatusError, match="stream"),
            client.messages.stream(model="claude", max_tokens=100, messages=MESSAGES) as stream,
        ):
            stream.get_final_message()
    finally:
        upstream.control(fail_after_chunks=0)


def test_x_api_key_counts_before_authorization_and_twice_is_refused(
    proxy: ProxyInThread,
) -> None:
    both = _post(
        proxy, "/v1/messages", json=BODY, headers={"authorization": "Bearer sk-someone-else"}
    )
    assert both.status_code == 200, both.text
    twice = httpx.post(
        f"{proxy.url}/v1/messages",
        json=BODY,
        headers=[("x-api-key", CLIENT), ("x-api-key", CLIENT)],
        timeout=10,
    )
    assert "x-api-key" in _anthropic_error(twice, 400, "invalid_request_error")


def test_cache_writes_count_as_input_and_cache_reads_do_not(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    """Anthropic's rule for its input-token limits, kept by the key's input window: a
    message of 11 uncached input tokens, 50 written to the cache and 3,000 read from it
    is charged 61 (docs/limiter.md)."""
    upstream.control(cache_read_tokens=3000, cache_write_tokens=50)
    first = _post(proxy, "/v1/messages", key=CACHED, json=BODY)
    assert first.json()["usage"]["cache_read_input_tokens"] == 3000
    proxy.settled()
    second = _post(proxy, "/v1/messages", key=CACHED, json=BODY)
    used = 100_000 - int(second.headers["anthropic-ratelimit-input-tokens-remaining"])
    assert 11 + 50 + 12 - 10 <= used <= 11 + 50 + 12, used


def test_an_upstream_refusing_the_deployments_key_is_an_api_error(proxy: ProxyInThread) -> None:
    """Anthropic's 401 authentication_error is the proxy's config at fault, never the
    client's key: 502, naming the deployment, not passed through as a 401."""
    answer = _post(proxy, "/v1/messages", json={**BODY, "model": "claude-bad-key"})
    assert "anthropic-bad-key" in _anthropic_error(answer, 502, "api_error")
