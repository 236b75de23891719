"""The Responses API shape: its checks, its estimate, usage of answers and of streams
(events split anywhere, an event too long to hold), and the ids a follow-up needs."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.costs import MAX_COUNT, TokenUsage
from proxy.errors import InvalidRequest
from proxy.shapes.responses import (
    RESPONSES,
    STORED_RESPONSES,
    FirstEvent,
    created_id,
    final_usage,
    input_tokens,
)
from proxy.shapes.sse import MAX_HELD, UsageTap

USAGE = {
    "input_tokens": 11,
    "input_tokens_details": {"cached_tokens": 4},
    "output_tokens": 16,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 27,
}


def event(kind: str, **data: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def stream(text: str = "hello world", usage: dict[str, Any] | None = USAGE) -> bytes:
    response = {"id": "resp_abc", "status": "in_progress", "usage": None}
    # As OpenAI orders it: the output, then the usage (near the end of a long event).
    done = {"id": "resp_abc", "status": "completed", "output_text": text, "usage": usage}
    return b"".join(
        [
            event("response.created", response=response),
            event("response.in_progress", response=response),
            *(event("response.output_text.delta", delta=word) for word in text.split()),
            event("response.completed", response=done),
        ]
    )


def tapped(chunks: list[bytes]) -> tuple[bytes, TokenUsage | None]:
    tap = UsageTap(RESPONSES.stream_usage(), strip_usage_event=False)
    out = b"".join(tap.feed(chunk) for chunk in chunks) + tap.flush()
    return out, tap.usage


EXPECTED = TokenUsage(input_tokens=11, output_tokens=16, cached_input=4)


def test_a_plain_answer_s_usage() -> None:
    body = orjson.dumps({"id": "resp_1", "status": "completed", "usage": USAGE})
    assert RESPONSES.usage(body) == EXPECTED
    assert created_id(body) == "resp_1"


@pytest.mark.parametrize(
    ("lie", "read"),
    [
        (b"18446744073709551617", TokenUsage(MAX_COUNT, 16, 4)),
        (b"-3", None),
        (b'"11"', None),
        (b"true", None),
        (b"1.5", None),
    ],
)
def test_a_usage_count_beyond_any_request_is_clamped_and_one_that_is_no_count_unread(
    lie: bytes, read: TokenUsage | None
) -> None:
    body = orjson.dumps({"id": "resp_1", "status": "completed", "usage": USAGE})
    told = b'"input_tokens":11'
    assert told in body
    assert RESPONSES.usage(body.replace(told, b'"input_tokens":' + lie)) == read


def test_a_response_not_yet_ended_states_no_usage() -> None:
    body = orjson.dumps({"id": "resp_1", "status": "queued", "usage": None})
    assert RESPONSES.usage(body) is None
    assert created_id(b"not json") is None


def test_a_read_response_s_usage_counts_once_it_is_over() -> None:
    """A background response read later: its usage is what it cost once it is over
    (completed, cancelled...); not while it runs, nor another response's."""
    over = orjson.dumps({"id": "resp_1", "status": "completed", "usage": USAGE})
    assert final_usage(over, "resp_1") == EXPECTED
    cancelled = orjson.dumps({"id": "resp_1", "status": "cancelled", "usage": USAGE})
    assert final_usage(cancelled, "resp_1") == EXPECTED
    running = orjson.dumps({"id": "resp_1", "status": "in_progress", "usage": USAGE})
    assert final_usage(running, "resp_1") is None
    assert final_usage(over, "resp_2") is None
    assert final_usage(b"[1]", "resp_1") is None
    assert final_usage(b"not json", "resp_1") is None


def test_a_stored_response_s_routes_use_no_tokens() -> None:
    body = orjson.dumps({"id": "resp_1", "status": "completed", "usage": USAGE})
    assert STORED_RESPONSES.usage(body) == TokenUsage()
    assert STORED_RESPONSES.estimate({}, 100)["tokens"] == 0


def test_the_stream_passes_unchanged_and_its_final_event_gives_the_usage() -> None:
    whole = stream()
    out, usage = tapped([whole])
    assert out == whole
    assert usage == EXPECTED
    assert RESPONSES.prepare({"stream": True}, True).changed == {}  # nothing asked for


@pytest.mark.parametrize("size", [1, 2, 7, 64])
def test_events_split_anywhere_are_read_once_whole(size: int) -> None:
    whole = stream()
    out, usage = tapped([whole[i : i + size] for i in range(0, len(whole), size)])
    assert out == whole
    assert usage == EXPECTED


def test_an_incomplete_or_failed_stream_s_usage_is_read_too() -> None:
    for kind in ("response.incomplete", "response.failed"):
        whole = event(kind, response={"usage": USAGE})
        assert tapped([whole])[1] == EXPECTED


@pytest.mark.slow
def test_an_event_longer_than_the_tap_holds_still_gives_its_usage() -> None:
    whole = stream(text="word " * (MAX_HELD // 3))
    assert len(whole) > 2 * MAX_HELD
    out, usage = tapped([whole[i : i + 4096] for i in range(0, len(whole), 4096)])
    assert out == whole
    assert usage == EXPECTED


def test_a_stream_cut_before_its_final_event_has_no_usage() -> None:
    whole = stream()
    cut = whole[: whole.index(b"event: response.completed") + 40]
    assert tapped([cut])[1] is None


def test_the_first_event_names_the_response() -> None:
    whole = stream()
    first = FirstEvent()
    found = [first.feed(whole[i : i + 5]) for i in range(0, 200, 5)]
    assert [rid for rid in found if rid] == ["resp_abc"]
    assert first.done


def test_a_first_event_that_is_not_response_created_names_nothing() -> None:
    first = FirstEvent()
    assert first.feed(event("error", message="no")) is None
    assert first.done


def test_the_estimate_counts_input_items_instructions_tools_and_the_output_cap() -> None:
    text = {"model": "m", "input": "x" * 400}
    items = {
        "model": "m",
        "input": [
            {"role": "user", "content": "x" * 400},
            {"type": "function_call", "name": "f", "arguments": "y" * 40},
            {"type": "function_call_output", "call_id": "c", "output": "z" * 80},
        ],
    }
    assert input_tokens(text) == 101
    assert input_tokens(items) == (4 + 101) + (4 + 11) + (4 + 21)
    with_more = {**text, "instructions": "i" * 40, "tools": [{"type": "function", "name": "f"}]}
    assert input_tokens(with_more) > input_tokens(text) + 10
    cost = RESPONSES.estimate({**text, "max_output_tokens": 500}, 4096)
    assert cost["output_tokens"] == 500 and cost["tokens"] == 601
    assert RESPONSES.estimate(text, 4096)["output_tokens"] == 4096


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": ["text"]}, "input[0]"),
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"max_output_tokens": True}, "max_output_tokens"),
        ({"stream": "true"}, "stream"),
        ({"store": 1}, "store"),
        ({"tools": {}}, "tools"),
        ({"instructions": 5}, "instructions"),
        ({"previous_response_id": 7}, "previous_response_id"),
    ],
)
def test_fields_the_proxy_reads_are_checked(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        RESPONSES.check({"model": "m", **body})
    assert raised.value.param == param


def test_a_broken_stream_ends_in_an_error_event_the_sdk_raises() -> None:
    ended = RESPONSES.stream_error("cut")
    name, data = ended.split(b"\n", 1)
    assert name == b"event: error"
    payload = orjson.loads(data.removeprefix(b"data: "))
    assert payload["type"] == "error" and payload["error"]["message"] == "cut"
