"""Streams translated event by event: a Messages stream (text, tool calls, their argument
pieces, usage) as chat chunks and a chat stream as Messages events, each read back by
the official SDK's own stream accumulator; the same bytes out however the upstream's
are cut; the usage chunk only when the client asked; errors in the client's shape; an
end without [DONE]; an event over the bound."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from proxy.translate import Untranslatable
from proxy.translate import stream as translate_stream
from proxy.translate.stream import EventStream, ToChat, ToMessages, to_chat

CREATED = 1_700_000_000


def _named(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return _named(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


MESSAGES_STREAM = b"".join(
    [
        _named(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 20,
                        "cache_creation_input_tokens": 5,
                        "cache_read_input_tokens": 300,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        _named(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        _named("ping", {"type": "ping"}),
        _block_delta(0, {"type": "text_delta", "text": "Let me "}),
        _block_delta(0, {"type": "text_delta", "text": "look."}),
        _named("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _named(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {},
                },
            },
        ),
        _block_delta(1, {"type": "input_json_delta", "partial_json": ""}),
        _block_delta(1, {"type": "input_json_delta", "partial_json": '{"city": '}),
        _block_delta(1, {"type": "input_json_delta", "partial_json": '"Paris"}'}),
        _named("content_block_stop", {"type": "content_block_stop", "index": 1}),
        _named(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "weather",
                    "input": {},
                },
            },
        ),
        _block_delta(2, {"type": "input_json_delta", "partial_json": '{"city": "Rome"}'}),
        _named("content_block_stop", {"type": "content_block_stop", "index": 2}),
        _named(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 42},
            },
        ),
        _named("message_stop", {"type": "message_stop"}),
    ]
)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _data(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": "gpt-x",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def _call(index: int, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        call.update(
            id=call_id, type="function", function={"name": "weather", "arguments": arguments}
        )
    return {"tool_calls": [call]}


CHAT_STREAM = b"".join(
    [
        _chunk({"role": "assistant", "content": "", "refusal": None}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "look."}),
        _chunk(_call(0, "", "call_1")),
        _chunk(_call(0, '{"city": ')),
        _chunk(_call(0, '"Paris"}')),
        _chunk(_call(1, '{"city": "Rome"}', "call_2")),
        _chunk({}, "tool_calls"),
        _data(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": "gpt-x",
                "choices": [],
                "usage": {
                    "prompt_tokens": 325,
                    "completion_tokens": 42,
                    "total_tokens": 367,
                    "prompt_tokens_details": {"cached_tokens": 300},
                },
            }
        ),
        b"data: [DONE]\n\n",
    ]
)


def _through(translation: EventStream, upstream: bytes, cut: int | None = None) -> bytes:
    """``upstream`` fed whole, or in pieces of ``cut`` bytes."""
    if cut is None:
        return translation.feed(upstream) + translation.flush()
    pieces = [upstream[i : i + cut] for i in range(0, len(upstream), cut)]
    return b"".join(translation.feed(piece) for piece in pieces) + translation.flush()


def _events(out: bytes) -> list[bytes]:
    return [event for event in out.split(b"\n\n") if event]


def _payloads(out: bytes) -> list[Any]:
    return [
        orjson.loads(event.split(b"data: ", 1)[1])
        for event in _events(out)
        if b"[DONE]" not in event
    ]


# --- Messages -> chat -----------------------------------------------------------------------


@pytest.mark.parametrize("cut", [None, 1, 7, 100])
def test_a_messages_stream_as_chat_chunks_read_by_the_openai_sdk(cut: int | None) -> None:
    out = _through(ToChat(include_usage=True, created=CREATED), MESSAGES_STREAM, cut)
    assert out == _through(ToChat(include_usage=True, created=CREATED), MESSAGES_STREAM)
    assert out.endswith(b"data: [DONE]\n\n")
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    chunks = [ChatCompletionChunk.model_validate(p) for p in _payloads(out)]
    for chunk in chunks:
        state.handle_chunk(chunk)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == "msg_1" and c.model == "claude-x" and c.created == CREATED for c in chunks)
    final = state.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, orjson.loads(c.function.arguments)) for c in calls] == [
        ("toolu_1", "weather", {"city": "Paris"}),
        ("toolu_2", "weather", {"city": "Rome"}),
    ]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (325, 42, 367)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 300


def test_the_tool_call_deltas_event_by_event() -> None:
    payloads = _payloads(_through(ToChat(include_usage=False, created=CREATED), MESSAGES_STREAM))
    deltas = [p["choices"][0]["delta"] for p in payloads]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Let me "},
        {"content": "look."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "Rome"}'}}]},
        {},
    ]
    assert [p["choices"][0]["finish_reason"] for p in payloads][-2:] == [None, "tool_calls"]
    assert all("usage" not in p for p in payloads)  # not asked for: no usage chunk either


def test_the_chat_clients_request_says_whether_it_gets_the_usage_chunk() -> None:
    assert to_chat({"stream_options": {"include_usage": True}}, 0)._include_usage
    assert not to_chat({"stream": True}, 0)._include_usage


def test_an_anthropic_error_event_is_an_openai_error_chunk() -> None:
    start = MESSAGES_STREAM.split(b"event: ping")[0]
    error = _named(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    out = _through(ToChat(include_usage=False, created=CREATED), start + error)
    assert _payloads(out)[-1] == {
        "error": {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None}
    }


# --- chat -> Messages -----------------------------------------------------------------------


def _accumulated(out: bytes) -> Any:
    snapshot = None
    buffers: dict[int, bytes] = {}
    for payload in _payloads(out):
        snapshot = accumulate_event(event=payload, current_snapshot=snapshot, json_bufs=buffers)
    return snapshot


@pytest.mark.parametrize("cut", [None, 1, 7, 100])
def test_a_chat_stream_as_messages_events_read_by_the_anthropic_sdk(cut: int | None) -> None:
    out = _through(ToMessages(), CHAT_STREAM, cut)
    assert out == _through(ToMessages(), CHAT_STREAM)
    names = [event.split(b"\n")[0] for event in _events(out)]
    assert names == [
        b"event: message_start",
        b"event: content_block_start",
        b"event: content_block_delta",
        b"event: content_block_delta",
        b"event: content_block_stop",
        b"event: content_block_start",
        b"event: content_block_delta",
        b"event: content_block_delta",
        b"event: content_block_stop",
        b"event: content_block_start",
        b"event: content_block_delta",
        b"event: content_block_stop",
        b"event: message_delta",
        b"event: message_stop",
    ]
    message = _accumulated(out)
    assert message.id == "chatcmpl-1" and message.model == "gpt-x"
    assert message.stop_reason == "tool_use"
    text, paris, rome = message.content
    assert text.type == "text" and text.text == "Let me look."
    assert (paris.id, paris.name, paris.input) == ("call_1", "weather", {"city": "Paris"})
    assert (rome.id, rome.name, rome.input) == ("call_2", "weather", {"city": "Rome"})
    # message_delta's usage, cumulative as Anthropic's: input = prompt - cached.
    assert message.usage.input_tokens == 25 and message.usage.output_tokens == 42
    assert message.usage.cache_read_input_tokens == 300


def test_a_refusal_streams_as_text_with_the_refusal_stop_reason() -> None:
    stream = b"".join(
        [
            _chunk({"role": "assistant", "content": None}),
            _chunk({"refusal": "I can't "}),
            _chunk({"refusal": "help."}),
            _chunk({}, "stop"),
            b"data: [DONE]\n\n",
        ]
    )
    message = _accumulated(_through(ToMessages(), stream))
    assert message.stop_reason == "refusal"
    assert message.content[0].text == "I can't help."


def test_a_chat_stream_ended_without_done_still_ends_its_message() -> None:
    out = _through(ToMessages(), CHAT_STREAM.replace(b"data: [DONE]\n\n", b""))
    assert _events(out)[-1].startswith(b"event: message_stop")
    assert _accumulated(out).stop_reason == "tool_use"
    cut = _through(ToMessages(), _chunk({"role": "assistant"}) + _chunk({"content": "Hal"}))
    assert b"message_stop" not in cut  # cut before its end: no end made up


def test_an_openai_error_chunk_is_an_anthropic_error_event() -> None:
    error = _data({"error": {"message": "The server had an error", "type": "server_error"}})
    out = _through(ToMessages(), _chunk({"role": "assistant"}) + error)
    assert _events(out)[-1] == _named(
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "The server had an error"}},
    ).rstrip(b"\n")


def test_an_event_over_the_bound_is_untranslatable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(translate_stream, "MAX_EVENT", 64)
    translation = ToMessages()
    with pytest.raises(Untranslatable):
        translation.feed(b"data: " + b"x" * 100)


def test_a_tool_use_block_started_with_its_whole_input_keeps_it() -> None:
    start = MESSAGES_STREAM.split(b"event: content_block_start")[0]
    whole = _named(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_9",
                "name": "weather",
                "input": {"city": "Oslo"},
            },
        },
    )
    [_, call] = _payloads(_through(ToChat(include_usage=False, created=CREATED), start + whole))
    assert call["choices"][0]["delta"]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
    }
