"""Chat completions to Bedrock's Converse API and back (pure): the request, what is
refused, the answer, the error and the stream, including what a lying upstream sends."""

from __future__ import annotations

import base64
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
from proxy.translate.converse_request import IMAGE_BYTES
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


PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n0000").decode()


def _tool(name: str = "weather", **more: Any) -> dict[str, Any]:
    function = {"name": name, "description": "The weather.", "parameters": SCHEMA, **more}
    return {"type": "function", "function": function}


def _call(arguments: str, **more: Any) -> dict[str, Any]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [{**call, **more}]}


def _image(url: str, detail: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url} if detail is None else {"url": url, "detail": detail}
    return _user([{"type": "image_url", "image_url": image}])


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
URL = "messages[0].content[0].image_url.url"


def test_tools_and_each_tool_choice_as_converses_tool_config() -> None:
    tools = [_tool(), {"type": "function", "function": {"name": "now"}}]
    config = to_converse({**CHAT, "tools": tools}, 256)["toolConfig"]
    assert config == {
        "tools": [
            {"toolSpec": {"name": "weather", "description": "The weather.",
                          "inputSchema": {"json": SCHEMA}}},
            {"toolSpec": {"name": "now", "inputSchema": {"json": {"type": "object",
                                                                   "properties": {}}}}},
        ]
    }  # fmt: skip
    named = {"type": "function", "function": {"name": "now"}}
    for choice, converse in (("auto", {"auto": {}}), ("required", {"any": {}}),
                             (named, {"tool": {"name": "now"}})):  # fmt: skip
        body = {**CHAT, "tools": tools, "tool_choice": choice, "parallel_tool_calls": True}
        assert to_converse(body, 256)["toolConfig"]["toolChoice"] == converse
    assert "toolConfig" not in to_converse({**CHAT, "tools": []}, 256)


def test_tool_calls_and_tool_results_as_tool_use_and_tool_result_blocks() -> None:
    two = _call('{"city": "Paris"}')
    two["content"] = ""  # an empty text beside calls: dropped (Converse refuses it)
    two["tool_calls"].append(
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}}
    )
    messages = [
        _user("Weather and time?"),
        two,
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "9am"}]},
        _user("Thanks; and tomorrow?"),
    ]
    turns = to_converse({**CHAT, "messages": messages, "tools": [_tool()]}, 256)["messages"]
    assert turns == [
        {"role": "user", "content": [{"text": "Weather and time?"}]},
        {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "call_1", "name": "weather", "input": {"city": "Paris"}}},
            {"toolUse": {"toolUseId": "call_2", "name": "now", "input": {}}},
        ]},
        {"role": "user", "content": [  # the results and the user's text: one user turn
            {"toolResult": {"toolUseId": "call_1", "content": [{"text": "Sunny"}]}},
            {"toolResult": {"toolUseId": "call_2", "content": [{"text": "9am"}]}},
            {"text": "Thanks; and tomorrow?"},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"text"'])
def test_arguments_that_are_no_json_object_are_refused_by_name(arguments: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        to_converse({**CHAT, "messages": [_user("x"), _call(arguments)]}, 256)
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments"


def test_a_base64_image_as_converses_image_block() -> None:
    content = to_converse({**CHAT, "messages": [_image(PNG, "auto")]}, 256)["messages"][0]
    data = PNG.split(",", 1)[1]
    assert content["content"] == [{"image": {"format": "png", "source": {"bytes": data}}}]
    jpg = to_converse({**CHAT, "messages": [_image("data:image/jpg;base64," + data)]}, 256)
    assert jpg["messages"][0]["content"][0]["image"]["format"] == "jpeg"


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,not base64!", "invalid_type"),
        ("data:image/png;base64,", "invalid_type"),
        ("data:image/png;base64," + "A" * (IMAGE_BYTES // 3 * 4 + 8), "image_too_large"),
    ],
)
def test_an_image_that_is_no_base64_or_too_large_is_refused_by_name(url: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        to_converse({**CHAT, "messages": [_image(url)]}, 256)
    assert (refused.value.param, refused.value.code) == (URL, code)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [_user([{"type": "input_audio"}])]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
        ({"messages": [_user("x"), {"role": "system", "content": "y"}]}, "messages[1]"),
        ({"temperature": "hot"}, "temperature"),
        ({"tools": [{"type": "custom", "custom": {}}]}, "tools[0].type"),
        ({"tools": [_tool(strict=True)]}, "tools[0].function.strict"),
        ({"tools": [_tool()], "tool_choice": "none"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [_tool()], "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
        ({"tools": [_tool()], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"messages": [_user("x"), _call("{}", type="custom")]}, "messages[1].tool_calls[0].type"),
        ({"messages": [_image("https://example.com/a.png")]}, URL),  # the proxy fetches none
        ({"messages": [_image("data:image/bmp;base64,Qk0=")]}, URL),
        ({"messages": [_image("data:text/plain,hi")]}, URL),
        ({"messages": [_image(PNG, "high")]}, "messages[0].content[0].image_url.detail"),
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


def test_a_tool_use_answer_as_chats_tool_calls() -> None:
    use = {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}
    content = [{"text": "Let me look."}, {"toolUse": use}]
    answer = _answer(output={"message": {"role": "assistant", "content": content}},
                     stopReason="tool_use")  # fmt: skip
    choice = orjson.loads(chat_from_converse(answer, 0)[0])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    call = choice["message"]["tool_calls"][0]
    assert (call["id"], call["type"], call["function"]["name"]) == (
        "tooluse_1",
        "function",
        "weather",
    )
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize(
    "use",
    [{"toolUseId": "t", "name": "f", "input": "{}"}, {"name": "f", "input": {}}, "toolUse"],
)
def test_a_tool_use_without_its_id_name_or_input_object_is_untranslatable(use: Any) -> None:
    content = [{"toolUse": use}]
    with pytest.raises(Untranslatable):
        chat_from_converse(_answer(output={"message": {"content": content}}), 0)


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


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for name, data in events
    )


def _tool_events(*pieces: str, index: int = 1, delta_index: int | None = None) -> bytes:
    start = {"toolUse": {"toolUseId": "tooluse_1", "name": "weather"}}
    at = index if delta_index is None else delta_index
    return _sse(
        [
            ("messageStart", {"role": "assistant"}),
            ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Looking."}}),
            ("contentBlockStop", {"contentBlockIndex": 0}),
            ("contentBlockStart", {"contentBlockIndex": index, "start": start}),
            *[
                ("contentBlockDelta", {"contentBlockIndex": at, "delta": {"toolUse": {"input": p}}})
                for p in pieces
            ],
            ("contentBlockStop", {"contentBlockIndex": index}),
            ("messageStop", {"stopReason": "tool_use"}),
            ("metadata", {"usage": USAGE}),
        ]
    )


@pytest.mark.parametrize("cut", [1, 7, 10_000])
def test_a_streamed_tool_use_as_chats_tool_call_deltas(cut: int) -> None:
    stream, events = to_converse_chat_stream(CHAT, 0), _tool_events('{"city"', ': "Paris"}')
    out = b"".join(stream.feed(events[i : i + cut]) for i in range(0, len(events), cut))
    chunks = [c for c in _chunks(out + stream.flush()) if c["choices"]]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or ()]
    assert calls[0]["id"] == "tooluse_1" and calls[0]["function"]["name"] == "weather"
    assert {call["index"] for call in calls} == {0}
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert orjson.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Looking."


@pytest.mark.parametrize(
    "liar",
    [
        _tool_events('{"city": ', '"Paris"'),  # the input never closes: no JSON object
        _tool_events("[1, 2]"),  # JSON, not an object
        _tool_events('{"city": "Paris"}', delta_index=4),  # a delta of a block never started
        _sse([("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": 1}}})]),
        _sse(
            [("contentBlockStart", {"contentBlockIndex": 0, "start": {"toolUse": {"name": "f"}}})]
        ),
        _sse([("contentBlockDelta", {"contentBlockIndex": -1, "delta": {"text": "x"}})]),
    ],
)
def test_a_lying_tool_use_stream_is_untranslatable(liar: bytes) -> None:
    stream = to_converse_chat_stream(CHAT, 0)
    with pytest.raises(Untranslatable):
        stream.feed(liar)
        stream.flush()
