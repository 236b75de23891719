"""A chat completions request as a Messages request: what is translated (system prompts,
turns, images, tools and their calls and results, caps, sampling, stop sequences,
options), what is accepted at its default, and what is refused with a 400 naming the
field in chat's terms (never dropped)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.translate.to_messages import to_messages

USER = {"role": "user", "content": "Hello"}
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


def _refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        to_messages(body, 256)
    return refused.value


def test_a_plain_request_gets_the_default_cap_when_it_sets_none() -> None:
    assert to_messages(_chat(), 256) == {
        "model": "m",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hello"}],
    }


@pytest.mark.parametrize(
    ("fields", "cap"),
    [
        ({"max_tokens": 50}, 50),
        ({"max_completion_tokens": 70}, 70),
        ({"max_completion_tokens": 70, "max_tokens": 50}, 70),  # the newer field wins
    ],
)
def test_the_clients_cap_is_the_max_tokens(fields: dict[str, Any], cap: int) -> None:
    assert to_messages(_chat(**fields), 256)["max_tokens"] == cap


def test_leading_system_and_developer_messages_are_the_system_prompt() -> None:
    body = _chat(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
            USER,
        ]
    )
    translated = to_messages(body, 256)
    assert translated["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use French."},
    ]
    assert translated["messages"] == [{"role": "user", "content": "Hello"}]
    one = to_messages(_chat(messages=[{"role": "system", "content": "Be brief."}, USER]), 1)
    assert one["system"] == "Be brief."


def test_a_system_message_after_the_conversation_began_is_refused() -> None:
    body = _chat(messages=[USER, {"role": "system", "content": "Now in French."}])
    refused = _refused(body)
    assert refused.param == "messages[1].role"
    assert refused.code == "untranslatable_field"
    assert "messages[1].role" in refused.message and "Anthropic Messages" in refused.message


def test_a_multi_turn_conversation_with_tool_calls_and_results() -> None:
    body = _chat(
        messages=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "Rain"}],
            },
            {"role": "user", "content": "Thanks"},
        ],
        tools=[TOOL],
    )
    translated = to_messages(body, 256)
    assert translated["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [  # the empty text beside the calls is no block
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",  # both results and the next user message: one turn
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "Sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": [{"type": "text", "text": "Rain"}],
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    assert translated["tools"] == [
        {
            "name": "weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "description": "The weather in a city.",
        }
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        (
            {"type": "function", "function": {"name": "weather"}},
            None,
            {"type": "tool", "name": "weather"},
        ),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
        (None, True, None),
    ],
)
def test_tool_choice_and_parallel_tool_calls(
    choice: Any, parallel: bool | None, expected: dict[str, Any] | None
) -> None:
    translated = to_messages(
        _chat(tools=[TOOL], tool_choice=choice, parallel_tool_calls=parallel), 9
    )
    assert translated.get("tool_choice") == expected


def test_a_tool_without_parameters_takes_an_empty_object_and_strict_is_kept() -> None:
    tool = {"type": "function", "function": {"name": "now", "strict": True}}
    [translated] = to_messages(_chat(tools=[tool]), 9)["tools"]
    assert translated == {
        "name": "now",
        "input_schema": {"type": "object", "properties": {}},
        "strict": True,
    }


def test_images_by_data_url_and_by_http_url() -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {
            "type": "image_url",
            "image_url": {"url": "https://example.com/cat.jpg", "detail": "auto"},
        },
    ]
    [turn] = to_messages(_chat(messages=[{"role": "user", "content": content}]), 9)["messages"]
    assert turn["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


@pytest.mark.parametrize(
    ("part", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "low"}},
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,raw"}},
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "ftp://x.test/a.png"}},
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
            "messages[0].content[0].type",
        ),
        ({"type": "file", "file": {"file_id": "f"}}, "messages[0].content[0].type"),
    ],
)
def test_content_with_no_counterpart_is_refused(part: dict[str, Any], param: str) -> None:
    assert _refused(_chat(messages=[{"role": "user", "content": [part]}])).param == param


def test_sampling_stop_and_options() -> None:
    translated = to_messages(
        _chat(
            temperature=0.5,
            top_p=0.9,
            stop="END",
            stream=True,
            stream_options={"include_usage": True},
            user="u-1",
            service_tier="default",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            },
        ),
        256,
    )
    assert translated["temperature"] == 0.5 and translated["top_p"] == 0.9
    assert translated["stop_sequences"] == ["END"]
    assert translated["stream"] is True and "stream_options" not in translated
    assert translated["metadata"] == {"user_id": "u-1"}
    assert translated["service_tier"] == "standard_only"
    assert translated["output_config"] == {
        "format": {"type": "json_schema", "schema": {"type": "object"}}
    }
    assert to_messages(_chat(stop=["a", "b"]), 1)["stop_sequences"] == ["a", "b"]
    assert to_messages(_chat(safety_identifier="s"), 1)["metadata"] == {"user_id": "s"}
    assert "output_config" not in to_messages(_chat(response_format={"type": "text"}), 1)


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1},
        {"logprobs": False},
        {"frequency_penalty": 0},
        {"presence_penalty": 0.0},
        {"logit_bias": {}},
        {"store": False},
        {"modalities": ["text"]},
        {"seed": None},  # null: as if absent
        {"parallel_tool_calls": True},
    ],
)
def test_fields_at_the_value_their_absence_means_are_accepted(fields: dict[str, Any]) -> None:
    to_messages(_chat(**fields), 256)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 0}, "logprobs"),  # not False: a number where a boolean goes
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"seed": 7}, "seed"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"prompt_cache_key": "k"}, "prompt_cache_key"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"something_new": 1}, "something_new"),
        ({"temperature": 1.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"response_format": {"type": "json_object"}}, "response_format.type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}, "description": "d"},
                }
            },
            "response_format.json_schema.description",
        ),
        ({"service_tier": "flex"}, "service_tier"),
        ({"stream_options": {"include_usage": True, "other": 1}}, "stream_options.other"),
        ({"user": "a", "safety_identifier": "b"}, "safety_identifier"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
        (
            {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
            "messages[0].name",
        ),
        ({"messages": [USER, {"role": "assistant", "content": "Sure"}]}, "messages[1]"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
                    USER,
                ]
            },
            "messages[1].content[0].type",
        ),
        (
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[1]"},
                            }
                        ],
                    },
                    USER,
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_what_has_no_counterpart_is_refused_naming_it(fields: dict[str, Any], param: str) -> None:
    refused = _refused(_chat(**fields))
    assert refused.param == param, refused.message
    assert refused.status == 400 and refused.type == "invalid_request_error"
    assert f"'{param}'" in refused.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"temperature": "hot"}, "temperature"),
        ({"stop": 3}, "stop"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    refused = _refused(_chat(**fields))
    assert (refused.param, refused.code) == (param, "invalid_type")
