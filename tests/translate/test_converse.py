"""Chat completions to Bedrock's Converse API and back (pure): the request, what is
refused, the answer, the error and the stream, including what a lying upstream sends."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.costs import TokenUsage
from proxy.errors import InvalidRequest
from proxy.shapes.converse import CONVERSE
from proxy.translate.converse import (
    chat_from_converse,
    converse_error,
    to_converse,
    to_converse_chat_stream,
)
from proxy.translate.refusals import Untranslatable

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "And?"},
    ],
    "max_completion_tokens": 30,
    "temperature": 0.5,
    "top_p": 0.9,
    "stop": "END",
    "stream": True,
    "stream_options": {"include_usage": True},
}
USAGE = {"inputTokens": 10, "outputTokens": 4, "totalTokens": 14, "cacheReadInputTokens": 2}


def test_a_chat_request_as_converse_takes_it() -> None:
    assert to_converse(CHAT, 256) == {
        "model": "m",
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Hi"}]},
            {"role": "assistant", "content": [{"text": "Hello."}]},
            {"role": "user", "content": [{"text": "And?"}]},
        ],
        "inferenceConfig": {
            "maxTokens": 30,
            "temperature": 0.5,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
    }
    plain = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert to_converse(plain, 256)["inferenceConfig"] == {"maxTokens": 256}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [_user([{"type": "image_url"}])]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [_user("x"), {"role": "system", "content": "y"}]}, "messages[1]"),
        ({"temperature": "hot"}, "temperature"),
    ],
)  # fmt: skip
def test_what_converse_has_no_counterpart_for_is_refused_by_name(
    change: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        to_converse({**CHAT, **change}, 256)
    assert refused.value.param == param


def _answer(**more: Any) -> bytes:
    message = {"role": "assistant", "content": [{"text": "Hel"}, {"text": "lo"}]}
    answer = {"output": {"message": message}, "stopReason": "max_tokens", "usage": USAGE}
    return orjson.dumps({**answer, **more})


def test_an_answer_as_a_chat_completion_and_its_usage_as_reported() -> None:
    body, usage = chat_from_converse(_answer(), 1700000000)
    answer = orjson.loads(body)
    assert answer["choices"][0]["message"]["content"] == "Hello"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["prompt_tokens"] == 12 and answer["usage"]["completion_tokens"] == 4
    assert usage == TokenUsage(input_tokens=10, output_tokens=4, cache_read=2)
    assert CONVERSE.usage(_answer()) == usage
    filtered, _ = chat_from_converse(_answer(stopReason="guardrail_intervened"), 0)
    assert orjson.loads(filtered)["choices"][0]["finish_reason"] == "content_filter"


@pytest.mark.parametrize("liar", [b"nope", b"[]", orjson.dumps({"output": {}})])
def test_an_answer_that_is_no_converse_answer_is_untranslatable(liar: bytes) -> None:
    with pytest.raises(Untranslatable):
        chat_from_converse(liar, 0)


def test_a_negative_count_is_no_usage() -> None:
    usage = {"inputTokens": -5, "outputTokens": 4}
    assert chat_from_converse(_answer(usage=usage), 0)[1] is None


def test_bedrocks_error_body_in_chats_shape() -> None:
    error = orjson.loads(converse_error(400, b'{"message":"Malformed input request"}'))
    assert error["error"]["message"] == "Malformed input request"
    assert error["error"]["type"] == "invalid_request_error"


def _events() -> bytes:
    events = [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "lo"}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn"}),
        ("metadata", {"usage": USAGE, "metrics": {"latencyMs": 9}}),
    ]
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for name, data in events
    )


def _chunks(out: bytes) -> list[Any]:
    return [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]


@pytest.mark.parametrize("cut", [1, 5, 64, 10_000])
def test_a_stream_as_chat_chunks_however_it_is_cut(cut: int) -> None:
    stream, events = to_converse_chat_stream(CHAT, 0), _events()
    out = b"".join(stream.feed(events[i : i + cut]) for i in range(0, len(events), cut))
    out += stream.flush()
    assert out.endswith(b"data: [DONE]\n\n")
    chunks = _chunks(out)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_bedrocks_exception_mid_stream_is_an_error_chunk() -> None:
    stream = to_converse_chat_stream(CHAT, 0)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "throttled"}}
    out = stream.feed(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
    assert _chunks(out)[-1]["error"]["type"] == "overloaded_error"


def test_a_stream_event_that_is_not_json_is_untranslatable() -> None:
    with pytest.raises(Untranslatable):
        to_converse_chat_stream(CHAT, 0).feed(b"event: metadata\ndata: {nope\n\n")
