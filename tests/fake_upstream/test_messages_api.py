"""The fake upstream speaks Anthropic's Messages API, checked with the official SDK: plain and
streamed messages, count_tokens, Anthropic's errors, and its strict request, input-token
and output-token windows with the anthropic-ratelimit-* headers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anthropic
import httpx
import pytest
from support.sse import named_events

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.fake_upstream.anthropic import limit_headers, rfc3339

MODEL = "claude-fake"
KEY = "sk-ant-upstream"
VERSION = "2023-06-01"
# "Hello there, fake!" is ceil(18 / 4) + 3 + 3 = 11 input tokens by the chat estimate
MESSAGES: list[Any] = [{"role": "user", "content": "Hello there, fake!"}]
BODY = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES}


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {"api_key": KEY}


@pytest.fixture
def client(upstream: FakeUpstreamHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=upstream.url, api_key=KEY, max_retries=0)


@pytest.fixture
def http(upstream: FakeUpstreamHandle) -> Iterator[httpx.Client]:
    headers = {"x-api-key": KEY, "anthropic-version": VERSION}
    with httpx.Client(base_url=upstream.url, headers=headers, timeout=5) as session:
        yield session


def anthropic_error(response: httpx.Response, status: int, type_: str) -> str:
    assert response.status_code == status
    body = response.json()
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == type_
    assert body["request_id"].startswith("req_")
    return str(body["error"]["message"])


# ------------------------------------------------------------------ messages


def test_a_plain_message_has_anthropics_shape_and_usage(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
    assert message.id.startswith("msg_")
    assert message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and len(block.text.split()) == 16
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert message.usage.input_tokens == 11
    assert message.usage.output_tokens == 16
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0


def test_the_system_prompt_counts_as_one_more_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES, system="abcd")
    assert message.usage.input_tokens == 11 + 1 + 3


def test_max_tokens_cuts_the_answer_with_stop_reason_max_tokens(
    client: anthropic.Anthropic,
) -> None:
    message = client.messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5


def test_a_stream_has_anthropics_events_in_order(http: httpx.Client) -> None:
    answer = http.post("/v1/messages", json={**BODY, "stream": True})
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [data for _, data in named_events(answer.text)]
    assert [event["type"] for event in events] == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 8,  # stream_chunks
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 11
    assert start["usage"]["output_tokens"] == 1
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["output_tokens"] == 16


def test_the_sdk_streams_and_assembles_the_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.input_tokens == 11
    assert final.usage.output_tokens == 16


def test_create_with_stream_true_yields_raw_events(client: anthropic.Anthropic) -> None:
    stream = client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES, stream=True)
    types = [event.type for event in stream]  # the SDK skips ping
    assert types[0] == "message_start" and types[-1] == "message_stop"


def test_count_tokens_answers_the_input_estimate(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=MESSAGES, system="abcd")
    assert counted.input_tokens == 11 + 1 + 3


def test_cache_options_report_cache_reads_and_writes(
    upstream: FakeUpstreamHandle, client: anthropic.Anthropic
) -> None:
    upstream.control(cache_read_tokens=300, cache_write_tokens=50)
    with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens == 11
    assert final.usage.cache_read_input_tokens == 300
    assert final.usage.cache_creation_input_tokens == 50


# ------------------------------------------------------------------ errors


def test_the_key_may_come_as_x_api_key_or_bearer(upstream: FakeUpstreamHandle) -> None:
    for headers in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
        answer = httpx.post(
            f"{upstream.url}/v1/messages",
            json=BODY,
            headers={**headers, "anthropic-version": VERSION},
        )
        assert answer.status_code == 200, headers


def test_a_wrong_or_missing_key_is_an_authentication_error(
    upstream: FakeUpstreamHandle,
) -> None:
    wrong = anthropic.Anthropic(base_url=upstream.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    missing = httpx.post(
        f"{upstream.url}/v1/messages", json=BODY, headers={"anthropic-version": VERSION}
    )
    anthropic_error(missing, 401, "authentication_error")


def test_without_a_configured_key_any_key_passes_but_none_does_not() -> None:
    with run_in_thread(FakeUpstreamConfig(port=0)) as upstream:
        url = f"{upstream.url}/v1/messages"
        headers = {"anthropic-version": VERSION}
        assert httpx.post(url, json=BODY, headers={**headers, "x-api-key": "any"}).is_success
        anthropic_error(httpx.post(url, json=BODY, headers=headers), 401, "authentication_error")


def test_anthropic_version_is_required(upstream: FakeUpstreamHandle) -> None:
    answer = httpx.post(f"{upstream.url}/v1/messages", json=BODY, headers={"x-api-key": KEY})
    message = anthropic_error(answer, 400, "invalid_request_error")
    assert message == "anthropic-version: header is required"
    bad = httpx.post(
        f"{upstream.url}/v1/messages",
        json=BODY,
        headers={"x-api-key": KEY, "anthropic-version": "latest"},
    )
    anthropic_error(bad, 400, "invalid_request_error")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": MODEL, "messages": MESSAGES}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 0, "messages": MESSAGES}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 10}, "messages"),
        ({"max_tokens": 10, "messages": MESSAGES}, "model"),
    ],
)
def test_a_bad_body_is_an_invalid_request_error_naming_the_field(
    http: httpx.Client, body: dict[str, Any], field: str
) -> None:
    message = anthropic_error(http.post("/v1/messages", json=body), 400, "invalid_request_error")
    assert message.startswith(f"{field}:")


def test_a_body_that_is_not_json_is_an_anthropic_error(http: httpx.Client) -> None:
    anthropic_error(http.post("/v1/messages", content=b"{"), 400, "invalid_request_error")


def test_fail_status_529_is_an_overloaded_error(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(fail_rate=1.0, fail_status=529)
    anthropic_error(http.post("/v1/messages", json=BODY), 529, "overloaded_error")
    upstream.control(fail_status=500)
    anthropic_error(http.post("/v1/messages", json=BODY), 500, "api_error")


def test_a_cut_stream_fails_the_sdk(
    upstream: FakeUpstreamHandle, client: anthropic.Anthropic
) -> None:
    upstream.control(fail_after_chunks=4)
    stream = client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES)
    with pytest.raises(Exception, match="peer closed connection"), stream as events:
        events.get_final_message()
    assert upstream.stats()["streams_cut"] == 1


# ------------------------------------------------------------------ strict windows


def test_requests_per_window_are_rate_limit_errors_with_retry_after(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(rpm=2)
    assert http.post("/v1/messages", json=BODY).status_code == 200
    assert http.post("/v1/messages", json=BODY).status_code == 200
    rejected = http.post("/v1/messages", json=BODY)
    message = anthropic_error(rejected, 429, "rate_limit_error")
    assert "requests per minute" in message
    assert 1 <= int(rejected.headers["retry-after"]) <= 60
    assert rejected.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert upstream.stats()["rejected_by_kind"] == {"requests": 1}


def test_input_tokens_count_uncached_input_and_cache_writes_not_reads(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    # 11 uncached + 9 written = 20 input tokens a request; the 1,000 read are free
    upstream.control(itpm=50, cache_read_tokens=1000, cache_write_tokens=9)
    assert http.post("/v1/messages", json=BODY).status_code == 200
    ok = http.post("/v1/messages", json=BODY)
    assert ok.headers["anthropic-ratelimit-input-tokens-remaining"] == "10"
    rejected = http.post("/v1/messages", json=BODY)
    assert "input tokens per minute" in anthropic_error(rejected, 429, "rate_limit_error")
    assert upstream.stats()["rejected_by_kind"] == {"input_tokens": 1}


def test_output_tokens_are_checked_at_max_tokens_and_counted_as_produced(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(otpm=140)
    # max_tokens 100 fits; 16 tokens are produced and counted
    assert http.post("/v1/messages", json=BODY).status_code == 200
    second = http.post("/v1/messages", json=BODY)
    assert second.headers["anthropic-ratelimit-output-tokens-remaining"] == str(140 - 32)
    # 32 used + max_tokens 100 = 132 fits; a fourth would need 48 + 100 > 140
    assert http.post("/v1/messages", json=BODY).status_code == 200
    rejected = http.post("/v1/messages", json=BODY)
    assert "output tokens per minute" in anthropic_error(rejected, 429, "rate_limit_error")
    assert upstream.stats()["rejected_by_kind"] == {"output_tokens": 1}


def test_every_answer_carries_the_configured_windows_headers(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(rpm=10, itpm=1000, otpm=500, window=60)
    before = time.time()
    answer = http.post("/v1/messages", json=BODY)
    after = time.time()
    headers = answer.headers
    assert headers["anthropic-ratelimit-requests-limit"] == "10"
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "1000"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(1000 - 11)
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "500"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == str(500 - 16)
    # tokens-* repeats the window with the least left: output, here
    assert headers["anthropic-ratelimit-tokens-limit"] == "500"
    assert headers["anthropic-ratelimit-tokens-remaining"] == str(500 - 16)
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
    assert reset.tzinfo is not None
    # the window empties 60 s after this request, rounded up to the second
    assert before + 60 <= reset.timestamp() <= after + 61
    assert "x-ratelimit-limit-requests" not in headers  # OpenAI's are for OpenAI's paths


def test_no_ratelimit_headers_without_limits(http: httpx.Client) -> None:
    answer = http.post("/v1/messages", json=BODY)
    assert not [name for name in answer.headers if name.startswith("anthropic-ratelimit")]
    assert answer.headers["request-id"].startswith("req_")


def test_itpm_and_otpm_limit_chat_too(upstream: FakeUpstreamHandle) -> None:
    upstream.control(itpm=20)
    chat = {"model": "gpt-4o-mini", "messages": MESSAGES}
    with httpx.Client(base_url=upstream.base_url, headers={"Authorization": f"Bearer {KEY}"}) as h:
        assert h.post("/chat/completions", json=chat).status_code == 200
        rejected = h.post("/chat/completions", json=chat)
    assert rejected.status_code == 429
    assert rejected.json()["error"]["type"] == "input_tokens"


def test_count_tokens_uses_no_window(upstream: FakeUpstreamHandle, http: httpx.Client) -> None:
    upstream.control(rpm=1)
    for _ in range(3):
        assert http.post("/v1/messages/count_tokens", json=BODY).status_code == 200
    assert upstream.stats()["by_endpoint"] == {"POST /v1/messages/count_tokens": 3}


# ------------------------------------------------------------------ headers, pure


def test_resets_are_rfc3339_utc_rounded_up_to_the_second() -> None:
    assert rfc3339(0.2, now=1_700_000_000.5) == "2023-11-14T22:13:21Z"
    assert rfc3339(0.0, now=1_700_000_000.0) == "2023-11-14T22:13:20Z"


def test_limits_are_announced_per_minute_whatever_the_window() -> None:
    headers = limit_headers({"input_tokens": (100, 30, 5.0)}, per_minute=6.0, now=0.0)
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "600"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "70"
    assert headers["anthropic-ratelimit-input-tokens-reset"] == "1970-01-01T00:00:05Z"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "70"


def test_echo_status_quotes_the_x_api_key_in_an_anthropic_error(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(echo_status=401)
    answer = http.post("/v1/messages", json=BODY)
    assert KEY in anthropic_error(answer, 401, "authentication_error")
    assert answer.headers["x-echo-authorization"] == KEY


def test_count_tokens_needs_model_and_messages(http: httpx.Client) -> None:
    for body, field in (({"messages": MESSAGES}, "model"), ({"model": MODEL}, "messages")):
        answer = http.post("/v1/messages/count_tokens", json=body)
        assert anthropic_error(answer, 400, "invalid_request_error").startswith(f"{field}:")


def test_error_after_chunks_ends_the_stream_with_an_overloaded_error_event(
    upstream: FakeUpstreamHandle, client: anthropic.Anthropic
) -> None:
    upstream.control(error_after_chunks=4)
    stream = client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES, stream=True)
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        list(stream)
    assert upstream.stats()["streams_errored"] == 1
