"""The fake upstream answers a request with tools by calling one, in both APIs, plain and
streamed (the official SDKs assemble the call): the tool ``tool_choice`` names, else the
first; a text answer when ``tool_choice`` is none, or (auto) when the last message is a
tool's result."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.fake_upstream import FakeUpstreamHandle

CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "first", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "second", "parameters": {"type": "object"}}},
]
MESSAGES_TOOLS: list[Any] = [
    {"name": "first", "input_schema": {"type": "object"}},
    {"name": "second", "input_schema": {"type": "object"}},
]
USER: list[Any] = [{"role": "user", "content": "Use a tool."}]


@pytest.fixture
def chat(upstream: FakeUpstreamHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.base_url, api_key="k", max_retries=0)


@pytest.fixture
def messages(upstream: FakeUpstreamHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=upstream.url, api_key="k", max_retries=0)


@pytest.mark.parametrize(
    ("choice", "name"),
    [
        (None, "first"),
        ("required", "first"),
        ({"type": "function", "function": {"name": "second"}}, "second"),
    ],
)
def test_chat_calls_a_tool_plain_and_streamed(chat: openai.OpenAI, choice: Any, name: str) -> None:
    extra = {} if choice is None else {"tool_choice": choice}
    answer = chat.chat.completions.create(
        model="gpt-4o-mini", messages=USER, tools=CHAT_TOOLS, **extra
    )
    [call] = answer.choices[0].message.tool_calls or []
    assert (
        answer.choices[0].finish_reason == "tool_calls"
        and answer.choices[0].message.content is None
    )
    assert call.function.name == name and "input" in orjson.loads(call.function.arguments)
    with chat.chat.completions.stream(
        model="gpt-4o-mini", messages=USER, tools=CHAT_TOOLS, **extra
    ) as stream:
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert streamed.id.startswith("call_") and streamed.function.name == name
    assert streamed.function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == "tool_calls"


def test_chat_answers_in_text_after_a_tool_result_or_with_tool_choice_none(
    chat: openai.OpenAI,
) -> None:
    result: list[Any] = [
        *USER,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "first", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    for body in ({"messages": result}, {"messages": USER, "tool_choice": "none"}):
        answer = chat.chat.completions.create(model="gpt-4o-mini", tools=CHAT_TOOLS, **body)
        assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content


@pytest.mark.parametrize(
    ("choice", "name"),
    [(None, "first"), ({"type": "any"}, "first"), ({"type": "tool", "name": "second"}, "second")],
)
def test_messages_calls_a_tool_plain_and_streamed(
    messages: anthropic.Anthropic, choice: Any, name: str
) -> None:
    extra = {} if choice is None else {"tool_choice": choice}
    answer = messages.messages.create(
        model="m", max_tokens=50, messages=USER, tools=MESSAGES_TOOLS, **extra
    )
    [block] = answer.content
    assert answer.stop_reason == "tool_use" and block.type == "tool_use"
    assert block.name == name and "input" in block.input
    with messages.messages.stream(
        model="m", max_tokens=50, messages=USER, tools=MESSAGES_TOOLS, **extra
    ) as stream:
        final = stream.get_final_message()
    [streamed] = final.content
    assert streamed.type == "tool_use" and streamed.input == block.input
    assert final.stop_reason == "tool_use"


def test_messages_answers_in_text_after_a_tool_result_or_with_tool_choice_none(
    messages: anthropic.Anthropic,
) -> None:
    result: list[Any] = [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "first", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}],
        },
    ]
    for body in ({"messages": result}, {"messages": USER, "tool_choice": {"type": "none"}}):
        answer = messages.messages.create(model="m", max_tokens=50, tools=MESSAGES_TOOLS, **body)
        assert [block.type for block in answer.content] == ["text"]
        assert answer.stop_reason == "end_turn"
