"""A Messages request as a chat completions request: the system prompt, turns (tool
results as tool messages in their order), images, tools and tool choice, the cap,
sampling, stop sequences, a stream's usage, caching hints accepted, and what has no
counterpart refused naming the field in the Messages API's terms."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.translate.to_chat import to_chat

USER = {"role": "user", "content": "Hello"}
TOOL = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _messages(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "messages": [USER], **fields}


def _refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        to_chat(body, 256)
    return refused.value


def test_a_plain_request() -> None:
    assert to_chat(_messages(system="Be brief."), 256) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, USER],
        "max_completion_tokens": 100,
    }


def test_a_system_prompt_of_blocks_and_a_system_turn_keep_their_place() -> None:
    body = _messages(
        system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use French."},
        ],
        messages=[USER, {"role": "system", "content": "Now in German."}, USER],
    )
    messages = to_chat(body, 256)["messages"]
    assert messages == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "Be brief."},
                {"type": "text", "text": "Use French."},
            ],
        },
        USER,
        {"role": "system", "content": "Now in German."},
        USER,
    ]


def test_tool_use_and_results_in_their_order() -> None:
    body = _messages(
        messages=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "Rain"}],
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        tools=[TOOL],
    )
    translated = to_chat(body, 256)
    assert translated["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": [{"type": "text", "text": "Rain"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    assert translated["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": TOOL["input_schema"],
                "description": "The weather in a city.",
            },
        }
    ]
    only_calls = to_chat(
        _messages(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ]
        ),
        1,
    )["messages"]
    assert only_calls[1]["content"] is None and only_calls[2]["content"] == ""


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
            None,
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any, parallel: bool | None) -> None:
    translated = to_chat(_messages(tools=[TOOL], tool_choice=choice), 1)
    assert translated["tool_choice"] == expected
    assert translated.get("parallel_tool_calls") == parallel


def test_images_become_image_url_parts() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What are these?"},
    ]
    [message] = to_chat(_messages(messages=[{"role": "user", "content": content}]), 1)["messages"]
    assert message == {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "text", "text": "What are these?"},
        ],
    }


def test_options_stream_usage_and_caching_hints() -> None:
    translated = to_chat(
        _messages(
            temperature=0.2,
            top_p=0.8,
            stop_sequences=["END"],
            stream=True,
            metadata={"user_id": "u-1"},
            service_tier="standard_only",
            thinking={"type": "disabled"},
            speed="standard",
            cache_control={"type": "ephemeral"},
            output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
            tools=[{**TOOL, "cache_control": {"type": "ephemeral"}, "strict": True}],
        ),
        256,
    )
    assert translated["temperature"] == 0.2 and translated["top_p"] == 0.8
    assert translated["stop"] == ["END"]
    assert translated["stream"] is True
    assert translated["stream_options"] == {"include_usage": True}
    assert translated["user"] == "u-1"
    assert translated["service_tier"] == "default"
    assert translated["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}, "strict": True},
    }
    assert translated["tools"][0]["function"]["strict"] is True
    assert "cache_control" not in translated and "thinking" not in translated


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 5}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"thinking": {"type": "adaptive"}}, "thinking"),
        ({"container": "c"}, "container"),
        ({"inference_geo": "us"}, "inference_geo"),
        ({"speed": "fast"}, "speed"),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"output_config": {"effort": "low"}}, "output_config.effort"),
        ({"metadata": {"user_id": "u", "tag": "x"}}, "metadata.tag"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{**TOOL, "input_examples": [{}]}]}, "tools[0].input_examples"),
        ({"messages": [USER, {"role": "assistant", "content": "The answer is"}]}, "messages[1]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True}],
                    }
                ]
            },
            "messages[0].content[0].is_error",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].content[0].type",
        ),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "..."}]},
                    USER,
                ]
            },
            "messages[1].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x", "citations": [{"type": "c"}]}],
                    }
                ]
            },
            "messages[0].content[0].citations",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
        ),
    ],
)
def test_what_has_no_counterpart_is_refused_naming_it(fields: dict[str, Any], param: str) -> None:
    refused = _refused(_messages(**fields))
    assert refused.param == param, refused.message
    assert refused.code == "untranslatable_field"
    assert f"'{param}'" in refused.message and "chat completions" in refused.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "warm"}, "temperature"),
        ({"tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"service_tier": "gold"}, "service_tier"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    refused = _refused(_messages(**fields))
    assert (refused.param, refused.code) == (param, "invalid_type")
