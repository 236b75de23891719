"""Anthropic's shapes: usage read as Anthropic reports it (cache writes count as input,
cache reads apart), streams known only once their final counts came, its error shape, the
key's limits as anthropic-ratelimit-* headers, the fields the proxy reads checked, and
what a message and a token count cost before they are sent."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from proxy.costs import MAX_COUNT, TokenUsage
from proxy.errors import InvalidRequest, ModelNotFound, RateLimited, ServiceUnavailable
from proxy.limiter.base import KeyVerdict, Usage
from proxy.shapes.anthropic import error_body, key_headers, stream_error, usage_of
from proxy.shapes.count_tokens import COUNT_TOKENS
from proxy.shapes.credentials import ANTHROPIC_KEY, BEARER
from proxy.shapes.messages import MESSAGES
from proxy.shapes.sse import UsageTap

USAGE = {
    "input_tokens": 20,
    "cache_creation_input_tokens": 5,
    "cache_read_input_tokens": 300,
    "output_tokens": 16,
}


def test_cache_writes_count_as_input_and_reads_stand_apart() -> None:
    usage = usage_of(USAGE)
    assert usage == TokenUsage(input_tokens=25, output_tokens=16, cache_read=300, cache_write=5)
    assert usage_of({"service_tier": "standard"}) is None
    assert usage_of({"input_tokens": -1, "output_tokens": True}) is None  # no counts


@pytest.mark.parametrize("field", list(USAGE))
@pytest.mark.parametrize("lie", [b"-5", b"-18446744073709551617", b"12.5", b'"12"', b"true"])
def test_a_usage_with_a_count_that_is_no_count_is_unreadable(field: str, lie: bytes) -> None:
    """Plain or streamed: none (the request is charged its estimate), never the other
    counts alone."""
    body = orjson.dumps({"type": "message", "usage": USAGE})
    assert MESSAGES.usage(body.replace(b'"%s":' % field.encode(), b'"x":')) is not None
    told = f'"{field}":{USAGE[field]}'.encode()
    assert MESSAGES.usage(body.replace(told, b'"%s":%s' % (field.encode(), lie))) is None
    tap = UsageTap(MESSAGES.stream_usage(), strip_usage_event=False)
    for chunk in (START, DELTA.replace(b'"output_tokens":16', b'"%s":%s' % (field.encode(), lie))):
        tap.feed(chunk)
    assert tap.usage is None


def test_a_count_beyond_64_bits_is_clamped_to_the_bound() -> None:
    body = b'{"type":"message","usage":{"input_tokens":18446744073709551617,"output_tokens":2}}'
    assert MESSAGES.usage(body) == TokenUsage(input_tokens=MAX_COUNT, output_tokens=2)


def test_a_plain_messages_usage() -> None:
    body = orjson.dumps({"type": "message", "usage": USAGE})
    assert MESSAGES.usage(body) == usage_of(USAGE)
    assert MESSAGES.usage(b"not json") is None


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"


START = _event(
    "message_start",
    {"type": "message_start", "message": {"usage": {**USAGE, "output_tokens": 1}}},
)
DELTA = _event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 16}})


def test_a_streams_usage_is_its_start_and_its_final_delta() -> None:
    tap = UsageTap(MESSAGES.stream_usage(), strip_usage_event=False)
    text = _event("content_block_delta", {"type": "content_block_delta", "delta": {"text": "hi"}})
    for chunk in (START, text, DELTA):
        assert tap.feed(chunk) == chunk  # passed on as it came
    assert tap.usage == usage_of(USAGE)


def test_a_stream_cut_before_its_final_delta_has_no_usage() -> None:
    """Its start says 1 output token: charging that would undercut the estimate."""
    tap = UsageTap(MESSAGES.stream_usage(), strip_usage_event=False)
    tap.feed(START)
    assert tap.usage is None


@pytest.mark.parametrize(
    ("error", "type_"),
    [
        (InvalidRequest("x"), "invalid_request_error"),
        (ModelNotFound("x"), "not_found_error"),
        (RateLimited("x", retry_after=2.0), "rate_limit_error"),
        (ServiceUnavailable("x"), "overloaded_error"),
    ],
)
def test_errors_take_anthropics_shape(error: Exception, type_: str) -> None:
    assert isinstance(error, InvalidRequest | ModelNotFound | RateLimited | ServiceUnavailable)
    body = orjson.loads(error_body(error))
    assert body == {"type": "error", "error": {"type": type_, "message": "x"}}


def test_a_broken_stream_ends_with_an_error_event() -> None:
    event = stream_error("cut")
    head, data = event.split(b"\n", 1)
    assert head == b"event: error" and event.endswith(b"\n\n")
    assert orjson.loads(data.removeprefix(b"data: "))["error"]["type"] == "api_error"


class _Verdict:
    """A key's verdict as the header writer reads it: the tightest window per kind."""

    def __init__(self, usages: dict[str, Usage]) -> None:
        self.usages = usages

    def tightest(self, kind: str) -> Usage | None:
        return self.usages.get(kind)


def test_the_keys_limits_as_anthropic_headers_reset_at_an_rfc3339_time() -> None:
    verdict = cast(KeyVerdict, _Verdict({"requests": Usage(10, 3.6, 0.2)}))
    headers = key_headers(verdict, now=1_800_000_000.0)
    assert headers == {
        "anthropic-ratelimit-requests-limit": "10",
        "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:01Z",
    }


def test_the_key_comes_as_x_api_key_or_bearer() -> None:
    assert ANTHROPIC_KEY.headers == ("x-api-key", "authorization")
    assert ANTHROPIC_KEY.secret("x-api-key", " sk-1 ") == "sk-1"
    assert ANTHROPIC_KEY.secret("x-api-key", "") is None
    assert ANTHROPIC_KEY.secret("authorization", "Bearer sk-2") == "sk-2"
    assert ANTHROPIC_KEY.secret("authorization", "Basic abc") is None


def test_openais_apis_take_the_key_as_bearer_or_x_api_key() -> None:
    """Every client route takes either form (a request with both: the API's own wins)."""
    assert BEARER.headers == ("authorization", "x-api-key")
    assert BEARER.secret("authorization", "Bearer sk-1") == "sk-1"
    assert BEARER.secret("x-api-key", " sk-2 ") == "sk-2"
    assert BEARER.secret("x-api-key", " ") is None
    assert BEARER.secret("authorization", "Basic abc") is None


def test_max_tokens_is_required_and_the_read_fields_checked() -> None:
    with pytest.raises(InvalidRequest) as missing:
        MESSAGES.check({"model": "m", "messages": []})
    assert missing.value.param == "max_tokens"
    for body, param in (
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "stream": "yes"}, "stream"),
        ({"max_tokens": 5, "messages": ["hi"]}, "messages[0]"),
        ({"max_tokens": 5, "system": 3}, "system"),
        ({"max_tokens": 5, "tools": {}}, "tools"),
    ):
        with pytest.raises(InvalidRequest) as wrong:
            MESSAGES.check(body)
        assert wrong.value.param == param
    COUNT_TOKENS.check({"model": "m", "messages": []})  # counting needs no max_tokens


def test_a_message_costs_its_input_and_max_tokens() -> None:
    body: dict[str, Any] = {
        "max_tokens": 300,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
    }
    cost = MESSAGES.estimate(body, default_output=16)
    assert cost["output_tokens"] == 300 and cost["requests"] == 1
    with_tools = MESSAGES.estimate({**body, "tools": [{"name": "t", "input_schema": {}}]}, 16)
    assert with_tools["input_tokens"] > cost["input_tokens"] > 0
    assert cost["tokens"] == cost["input_tokens"] + 300


def test_a_token_count_costs_one_request_and_no_tokens() -> None:
    cost = COUNT_TOKENS.estimate({"messages": [{"role": "user", "content": "x" * 400}]}, 16)
    assert cost["requests"] == 1 and cost["tokens"] == 0
    assert COUNT_TOKENS.usage(b'{"input_tokens": 104}') == TokenUsage()


def test_tool_results_and_tool_calls_count_by_their_size() -> None:
    """An agent's turns carry their input in tool results and tool calls, not text."""
    output = "line of a file\n" * 400  # 6,000 characters
    body: dict[str, Any] = {
        "max_tokens": 10,
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": "x" * 400}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": output}],
            },
        ],
    }
    assert MESSAGES.estimate(body, 16)["input_tokens"] >= (6000 + 400) / 4


def test_counts_of_names_it_does_not_know_are_counted_where_their_names_say() -> None:
    """A ``*_tokens`` integer of a new name is tokens Anthropic counted: output if its
    name says so, a cache read if it says that, input otherwise (its limit counts it);
    the nested breakdowns (cache_creation by lifetime, server tools' requests) and what
    is no count add nothing."""
    usage = {
        **USAGE,
        "cache_creation": {"ephemeral_5m_input_tokens": 5, "ephemeral_1h_input_tokens": 0},
        "server_tool_use": {"web_search_requests": 2},
        "service_tier": "standard",
        "image_input_tokens": 40,
        "thinking_output_tokens": 7,
        "cache_read_extra_tokens": 9,
        "odd_tokens": "12",
        "negative_tokens": -3,
    }
    assert usage_of(usage) == TokenUsage(
        input_tokens=25 + 40, output_tokens=16 + 7, cache_read=300 + 9, cache_write=5
    )


def test_a_streams_counts_of_unknown_names_are_counted_too() -> None:
    tap = UsageTap(MESSAGES.stream_usage(), strip_usage_event=False)
    delta = _event(
        "message_delta",
        {"type": "message_delta", "usage": {"output_tokens": 16, "audio_output_tokens": 4}},
    )
    for chunk in (START, delta):
        tap.feed(chunk)
    assert tap.usage is not None and tap.usage.output_tokens == 20
