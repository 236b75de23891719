"""Answers back in the client's API: a buffered Messages answer as a chat completion and a
chat completion as a Messages answer (text, tool calls, refusals, stop reasons, usage with
its cache counts), read by the official SDKs' own types; the usage settlement reads is
the upstream's own; error bodies re-shaped; what cannot be translated is Untranslatable."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion

from proxy.costs import TokenUsage
from proxy.translate import Untranslatable
from proxy.translate.response import (
    chat_error,
    chat_from_message,
    chat_usage,
    finish_reason,
    message_from_chat,
    messages_error,
    messages_usage,
    stop_reason,
)

CREATED = 1_700_000_000
ANTHROPIC_USAGE = {
    "input_tokens": 20,
    "cache_creation_input_tokens": 5,
    "cache_read_input_tokens": 300,
    "output_tokens": 16,
}


def _message(content: list[dict[str, Any]], stop: str = "end_turn") -> bytes:
    return orjson.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": ANTHROPIC_USAGE,
        }
    )


def _completion(message: dict[str, Any], finish: str = "stop") -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": CREATED,
            "model": "gpt-x",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": 325,
                "completion_tokens": 16,
                "total_tokens": 341,
                "prompt_tokens_details": {"cached_tokens": 300},
            },
        }
    )


def test_a_message_with_text_and_tool_use_as_a_chat_completion() -> None:
    content = [
        {"type": "text", "text": "Let me "},
        {"type": "text", "text": "look."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ]
    body, usage = chat_from_message(_message(content, "tool_use"), CREATED)
    completion = ChatCompletion.model_validate_json(body)  # the SDK's own type, strictly
    assert completion.id == "msg_1" and completion.model == "claude-x"
    assert completion.created == CREATED and completion.object == "chat.completion"
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    [call] = choice.message.tool_calls or []
    assert call.id == "toolu_1" and call.type == "function"
    assert call.function.name == "weather"
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    # prompt = input + cache reads + cache writes; cached = reads
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 325 and completion.usage.completion_tokens == 16
    assert completion.usage.total_tokens == 341
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 300
    # Settlement reads Anthropic's own units: cache writes are input, reads apart.
    assert usage == TokenUsage(input_tokens=25, output_tokens=16, cache_read=300, cache_write=5)


def test_a_chat_completion_with_text_and_tool_calls_as_a_message() -> None:
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    body, usage = message_from_chat(_completion(message, "tool_calls"), CREATED)
    answer = Message.model_validate_json(body)
    assert answer.id == "chatcmpl-1" and answer.model == "gpt-x" and answer.role == "assistant"
    assert answer.stop_reason == "tool_use" and answer.stop_sequence is None
    text, tool = answer.content
    assert text.type == "text" and text.text == "Let me look."
    assert tool.type == "tool_use" and tool.id == "call_1" and tool.name == "weather"
    assert tool.input == {"city": "Paris"}
    # input = prompt - cached; cache reads = cached; chat reports no cache writes
    assert answer.usage.input_tokens == 25 and answer.usage.output_tokens == 16
    assert answer.usage.cache_read_input_tokens == 300
    assert answer.usage.cache_creation_input_tokens == 0
    assert usage == TokenUsage(input_tokens=325, output_tokens=16, cached_input=300)


def test_a_refusal_is_a_refusal_both_ways() -> None:
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    answer = Message.model_validate_json(message_from_chat(_completion(refusal), 0)[0])
    assert answer.stop_reason == "refusal"
    assert [block.text for block in answer.content if block.type == "text"] == [
        "I can't help with that."
    ]
    back = ChatCompletion.model_validate_json(chat_from_message(_message([], "refusal"), 0)[0])
    assert back.choices[0].finish_reason == "content_filter"
    assert back.choices[0].message.content is None


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        (None, None),
    ],
)
def test_stop_reasons_as_finish_reasons(stop: str | None, finish: str | None) -> None:
    assert finish_reason(stop) == finish


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        (None, None),
    ],
)
def test_finish_reasons_as_stop_reasons(finish: str | None, stop: str | None) -> None:
    assert stop_reason(finish) == stop


def test_usage_both_ways_keeps_every_token() -> None:
    chat = chat_usage(ANTHROPIC_USAGE)
    assert chat["prompt_tokens"] == 325 and chat["prompt_tokens_details"]["cached_tokens"] == 300
    back = messages_usage(chat)
    total_in = (
        back["input_tokens"] + back["cache_read_input_tokens"] + back["cache_creation_input_tokens"]
    )
    assert total_in == 325 and back["output_tokens"] == 16
    # Missing or garbled counts are 0, never an error (settlement reads its own).
    assert chat_usage(None)["prompt_tokens"] == 0
    assert messages_usage({"prompt_tokens": -3, "completion_tokens": "x"})["output_tokens"] == 0
    assert (
        messages_usage({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}})[
            "cache_read_input_tokens"
        ]
        == 5
    )


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        orjson.dumps({"choices": []}),
        _completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                ],
            }
        ),
    ],
)
def test_a_chat_answer_that_cannot_be_a_message_is_untranslatable(content: bytes) -> None:
    with pytest.raises(Untranslatable):
        message_from_chat(content, 0)


def test_error_bodies_take_the_clients_shape() -> None:
    openai_error = orjson.dumps(
        {
            "error": {
                "message": "Invalid value for 'messages'.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
        }
    )
    assert orjson.loads(messages_error(400, openai_error)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "Invalid value for 'messages'."},
    }
    assert orjson.loads(messages_error(404, openai_error))["error"]["type"] == "not_found_error"
    anthropic_error = orjson.dumps(
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
            "request_id": "req_1",
        }
    )
    assert orjson.loads(chat_error(400, anthropic_error)) == {
        "error": {
            "message": "max_tokens: too large",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    # A body in neither shape: its text as the message.
    assert (
        orjson.loads(chat_error(422, b'{"detail": "x"}'))["error"]["message"] == '{"detail": "x"}'
    )
    assert orjson.loads(messages_error(400, b"plain"))["error"]["message"] == "plain"


def test_chat_content_given_as_text_parts_is_one_text_block() -> None:
    parts = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
    }
    answer = Message.model_validate_json(message_from_chat(_completion(parts), 0)[0])
    assert [(b.type, getattr(b, "text", None)) for b in answer.content] == [("text", "Hello")]
