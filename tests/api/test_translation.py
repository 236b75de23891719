"""Translation through a real proxy (issue 54): a model group of one OpenAI and one
Anthropic deployment (two fake upstreams, one speaking each API here) serves the official
openai and anthropic SDKs, plain and streamed, tools included (a whole tool loop), each
request translated only when the deployment it reaches does not speak its API: which one
serves is decided by the other failing (a retry crosses providers). The upstream sees
its own API (its path, body and key); errors come back in the client's shape; a field
with no counterpart is a 400 naming it, and a deployment speaking the client's API still
serves such a request; the key is charged the deployment's own usage (cache counts
included); /v1/models lists to each API's clients what they reach; unsupported_api
remains for APIs nothing translates to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.providers import PROVIDERS
from proxy.providers.openai import OpenAICompatible

OPENAI_KEY = "sk-openai-upstream-secret"
ANTHROPIC_KEY = "sk-ant-upstream-secret"
CLIENT = "sk-client-translation"
ADMIN = "admin-translation"
USER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
        },
    }
]
MESSAGES_TOOLS: list[Any] = [
    {
        "name": "weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"input": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, FakeUpstreamHandle]]:
    """The OpenAI deployment's upstream and the Anthropic one's (the fake speaks both
    APIs: each is asked only its own here)."""
    with (
        run_in_thread(FakeUpstreamConfig(port=0, api_key=OPENAI_KEY, chunk_delay=0)) as gpt,
        run_in_thread(FakeUpstreamConfig(port=0, api_key=ANTHROPIC_KEY, chunk_delay=0)) as claude,
    ):
        yield {"openai": gpt, "anthropic": claude}


def _config(upstreams: dict[str, FakeUpstreamHandle]) -> dict[str, Any]:
    gpt, claude = upstreams["openai"], upstreams["anthropic"]
    openai_deployment = {
        "id": "openai-d",
        "base_url": gpt.base_url,
        "api_key": OPENAI_KEY,
        "model": "gpt-upstream",
    }
    anthropic_deployment = {
        "id": "anthropic-d",
        "provider": "anthropic",
        "base_url": claude.url,
        "api_key": ANTHROPIC_KEY,
        "model": "claude-upstream",
    }
    return {
        "keys": [
            # Refilled so slowly (a token a minute) that what a request took shows whole.
            {"name": "app", "key": CLIENT, "limits": [{"tokens": 43_200, "per": "30d"}]},
        ],
        "admin": {"keys": [ADMIN]},
        "models": [
            {"name": "mixed", "deployments": [openai_deployment, anthropic_deployment]},
            {"name": "claude", "deployments": [{**anthropic_deployment, "id": "anthropic-only"}]},
            {"name": "gpt", "deployments": [{**openai_deployment, "id": "openai-only"}]},
        ],
        # A failing deployment is never cooled here: each request meets its failure and
        # is retried on the other, whatever the tests before did.
        "routing": {
            "retries": 1,
            "cooldown": {"allowed_fails": 100_000, "window": "1s", "time": "1s"},
        },
    }


@pytest.fixture(scope="module")
def proxy(upstreams: dict[str, FakeUpstreamHandle]) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(_config(upstreams))) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(upstreams: dict[str, FakeUpstreamHandle]) -> None:
    for upstream in upstreams.values():
        upstream.control(fail_rate=0.0, cache_read_tokens=0, cache_write_tokens=0)
        upstream.reset()


def _served_by(upstreams: dict[str, FakeUpstreamHandle], side: str) -> FakeUpstreamHandle:
    """Have the other deployment fail every request (500): ``side``'s serves them all,
    at once or as the retry."""
    for name, upstream in upstreams.items():
        upstream.control(fail_rate=0.0 if name == side else 1.0, fail_status=500)
    return upstreams[side]


@pytest.fixture
def chat(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=CLIENT, max_retries=0)


@pytest.fixture
def messages(proxy: ProxyInThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT, max_retries=0)


def _last(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    last = upstream.stats()["last_request"]
    assert last is not None
    return dict(last)


# --- chat clients ----------------------------------------------------------------------


def test_a_chat_client_is_served_by_the_anthropic_deployment(
    chat: openai.OpenAI, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    claude = _served_by(upstreams, "anthropic")
    answer = chat.chat.completions.with_raw_response.create(
        model="mixed",
        messages=[{"role": "system", "content": "Be brief."}, *USER],
        max_tokens=5,
        temperature=0.5,
        stop=["END"],
    )
    completion = answer.parse()
    assert answer.headers["x-request-id"]
    assert completion.object == "chat.completion" and completion.model == "claude-upstream"
    assert completion.choices[0].message.content == "Lorem ipsum dolor sit amet,"
    assert completion.choices[0].finish_reason == "length"  # max_tokens, as chat says it
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    sent = _last(claude)
    assert sent["path"] == "/v1/messages"
    assert sent["headers"]["x-api-key"] == ANTHROPIC_KEY
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    assert CLIENT not in orjson.dumps(sent).decode()
    assert sent["body"] == {
        "model": "claude-upstream",
        "max_tokens": 5,
        "system": "Be brief.",
        "messages": USER,
        "temperature": 0.5,
        "stop_sequences": ["END"],
    }


def test_a_chat_request_without_a_cap_gets_the_default_one(
    chat: openai.OpenAI, proxy: ProxyInThread, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    claude = _served_by(upstreams, "anthropic")
    chat.chat.completions.create(model="mixed", messages=USER)
    assert _last(claude)["body"]["max_tokens"] == proxy.settings.server.default_max_tokens


def test_a_chat_client_streams_from_the_anthropic_deployment(
    chat: openai.OpenAI, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    _served_by(upstreams, "anthropic")
    chunks = list(
        chat.chat.completions.create(
            model="mixed",
            messages=USER,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Lorem ipsum dolor sit amet, consectetur adipiscing elit,"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 8
    plain = list(
        chat.chat.completions.create(model="mixed", messages=USER, max_tokens=8, stream=True)
    )
    assert all(c.usage is None for c in plain)  # not asked for: no usage chunk


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_chat_clients_tool_loop_through_the_anthropic_deployment(
    chat: openai.OpenAI, upstreams: dict[str, FakeUpstreamHandle], stream: bool
) -> None:
    claude = _served_by(upstreams, "anthropic")
    if stream:
        with chat.chat.completions.stream(model="mixed", messages=USER, tools=CHAT_TOOLS) as events:
            first = events.get_final_completion()
    else:
        first = chat.chat.completions.create(model="mixed", messages=USER, tools=CHAT_TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "weather" and call.id.startswith("toolu_")
    arguments = orjson.loads(call.function.arguments)
    assert set(arguments) == {"input"}
    assert _last(claude)["body"]["tools"] == [
        {
            "name": "weather",
            "input_schema": CHAT_TOOLS[0]["function"]["parameters"],
            "description": "The weather in a city.",
        }
    ]
    history: list[Any] = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    final = chat.chat.completions.create(model="mixed", messages=history, tools=CHAT_TOOLS)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert _last(claude)["body"]["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call.id, "name": "weather", "input": arguments}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}],
        },
    ]


def test_the_same_chat_request_goes_as_it_is_to_the_openai_deployment(
    chat: openai.OpenAI, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    gpt = _served_by(upstreams, "openai")
    chat.chat.completions.create(model="mixed", messages=USER, max_tokens=5, logprobs=True)
    sent = _last(gpt)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"] == {
        "model": "gpt-upstream",
        "messages": USER,
        "max_tokens": 5,
        "logprobs": True,
    }


# --- Messages clients --------------------------------------------------------------------


def test_a_messages_client_is_served_by_the_openai_deployment(
    messages: anthropic.Anthropic, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    gpt = _served_by(upstreams, "openai")
    message = messages.messages.create(
        model="mixed",
        max_tokens=5,
        system="Be brief.",
        messages=USER,
        stop_sequences=["END"],
        metadata={"user_id": "u-42"},
    )
    assert message.type == "message" and message.model == "gpt-upstream"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Lorem ipsum dolor sit amet,"  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5 and message.usage.input_tokens > 0
    sent = _last(gpt)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent["body"] == {
        "model": "gpt-upstream",
        "messages": [{"role": "system", "content": "Be brief."}, *USER],
        "max_completion_tokens": 5,
        "stop": ["END"],
        "user": "u-42",
    }


def test_a_messages_client_streams_from_the_openai_deployment(
    messages: anthropic.Anthropic, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    gpt = _served_by(upstreams, "openai")
    with messages.messages.stream(model="mixed", max_tokens=8, messages=USER) as events:
        text = "".join(events.text_stream)
        final = events.get_final_message()
    assert text == "Lorem ipsum dolor sit amet, consectetur adipiscing elit,"
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8 and final.usage.input_tokens > 0
    assert _last(gpt)["body"]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_messages_clients_tool_loop_through_the_openai_deployment(
    messages: anthropic.Anthropic, upstreams: dict[str, FakeUpstreamHandle], stream: bool
) -> None:
    gpt = _served_by(upstreams, "openai")
    ask: dict[str, Any] = {"model": "mixed", "max_tokens": 50, "tools": MESSAGES_TOOLS}
    if stream:
        with messages.messages.stream(messages=USER, **ask) as events:
            first = events.get_final_message()
    else:
        first = messages.messages.create(messages=USER, **ask)
    assert first.stop_reason == "tool_use"
    [use] = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "weather" and set(use.input) == {"input"}  # type: ignore[arg-type]
    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
        },
    ]
    final = messages.messages.create(messages=history, **ask)
    assert final.stop_reason == "end_turn" and final.content[0].type == "text"
    sent = _last(gpt)["body"]
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": orjson.dumps(use.input).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "Sunny"},
    ]


# --- errors, refusals, what stays unsupported ---------------------------------------------


def test_an_upstream_error_comes_back_in_the_clients_shape(
    messages: anthropic.Anthropic,
    chat: openai.OpenAI,
    upstreams: dict[str, FakeUpstreamHandle],
) -> None:
    _served_by(upstreams, "openai")
    # The chat upstream refuses an empty conversation in OpenAI's shape: Anthropic's here.
    with pytest.raises(anthropic.BadRequestError) as refused:
        messages.messages.create(model="mixed", max_tokens=5, messages=[])
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"]
    # The Messages upstream's 400 (Anthropic's shape) reaches a chat client as OpenAI's.
    claude = _served_by(upstreams, "anthropic")
    claude.control(echo_status=400)
    try:
        with pytest.raises(openai.BadRequestError) as bad:
            chat.chat.completions.create(model="mixed", messages=USER, max_tokens=5)
    finally:
        claude.control(echo_status=None)
    error = bad.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert ANTHROPIC_KEY not in error["message"]  # redacted before it was re-shaped


def test_a_failing_upstream_is_the_clients_error_in_its_shape(
    messages: anthropic.Anthropic, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    upstreams["openai"].control(fail_rate=1.0, fail_status=500)
    with pytest.raises(anthropic.InternalServerError) as failed:
        messages.messages.create(model="gpt", max_tokens=5, messages=USER)
    assert failed.value.response.json()["type"] == "error"


def test_a_field_with_no_counterpart_is_refused_naming_it(
    chat: openai.OpenAI,
    messages: anthropic.Anthropic,
    upstreams: dict[str, FakeUpstreamHandle],
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat.chat.completions.create(model="claude", messages=USER, n=2)
    error = refused.value.response.json()["error"]
    assert (error["param"], error["code"]) == ("n", "untranslatable_field")
    with pytest.raises(anthropic.BadRequestError) as thinking:
        messages.messages.create(
            model="gpt",
            max_tokens=2048,
            messages=USER,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert "'thinking'" in thinking.value.response.json()["error"]["message"]
    assert all(u.stats()["requests"] == 0 for u in upstreams.values())
    # A deployment speaking the client's API serves it; the other is not tried with it.
    _served_by(upstreams, "openai")
    assert len(chat.chat.completions.create(model="mixed", messages=USER, n=2).choices) >= 1
    upstreams["openai"].control(fail_rate=1.0)
    with pytest.raises(openai.InternalServerError):
        chat.chat.completions.create(model="mixed", messages=USER, n=2)
    assert upstreams["anthropic"].stats()["requests"] == 0


@pytest.mark.slow
def test_apis_nothing_translates_to_remain_unsupported(proxy: ProxyInThread) -> None:
    headers = {"authorization": f"Bearer {CLIENT}"}
    for path, body in (
        ("/v1/responses", {"model": "claude", "input": "hi"}),
        ("/v1/embeddings", {"model": "claude", "input": "hi"}),
        ("/v1/completions", {"model": "claude", "prompt": "hi"}),
    ):
        answer = httpx.post(f"{proxy.url}{path}", json=body, headers=headers, timeout=10)
        assert answer.status_code == 400, path
        assert answer.json()["error"]["code"] == "unsupported_api"
    counted = httpx.post(
        f"{proxy.url}/v1/messages/count_tokens",
        json={"model": "gpt", "messages": USER},
        headers={"x-api-key": CLIENT, "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert counted.status_code == 400 and counted.json()["error"]["type"] == "invalid_request_error"
    assert "messages/count_tokens" in counted.json()["error"]["message"]


# --- usage and listing -------------------------------------------------------------------------


def _tokens_used(proxy: ProxyInThread, before: float) -> float:
    """The key's token window used since ``before`` (its remaining then), once its
    settlement is in."""
    deadline = time.monotonic() + 10.0
    while True:
        answer = httpx.get(
            f"{proxy.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
        )
        [key] = answer.json()["keys"]
        [window] = [w for w in key["windows"] if w["kind"] == "tokens"]
        used = before - float(window["remaining"])
        if used > 0 or time.monotonic() > deadline:
            return used
        time.sleep(0.05)


def _remaining(proxy: ProxyInThread) -> float:
    answer = httpx.get(
        f"{proxy.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    [key] = answer.json()["keys"]
    [window] = [w for w in key["windows"] if w["kind"] == "tokens"]
    return float(window["remaining"])


def test_the_key_is_charged_the_deployments_own_usage_cache_counts_included(
    chat: openai.OpenAI, proxy: ProxyInThread, upstreams: dict[str, FakeUpstreamHandle]
) -> None:
    claude = _served_by(upstreams, "anthropic")
    claude.control(cache_read_tokens=300, cache_write_tokens=40)
    before = _remaining(proxy)
    completion = chat.chat.completions.create(model="mixed", messages=USER, max_tokens=6)
    proxy.settled()
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    uncached = claude.stats()["prompt_tokens_served"]
    # prompt = input + cache reads + cache writes; cached = the reads
    assert usage.prompt_tokens == uncached + 300 + 40
    assert usage.prompt_tokens_details.cached_tokens == 300
    assert _tokens_used(proxy, before) == pytest.approx(uncached + 40 + 300 + 6, abs=1)


def test_the_models_listed_are_those_each_apis_clients_reach(
    chat: openai.OpenAI, messages: anthropic.Anthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = {"mixed", "claude", "gpt"}
    assert {m.id for m in chat.models.list()} == everything
    assert {m.id for m in messages.models.list()} == everything
    assert messages.models.retrieve("gpt").id == "gpt"


def test_a_group_no_messages_client_reaches_is_not_listed_to_one(
    upstreams: dict[str, FakeUpstreamHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    class EmbeddingsOnly(OpenAICompatible):
        shapes = frozenset({"embeddings"})

    monkeypatch.setitem(PROVIDERS, "openai", EmbeddingsOnly())
    with ProxyInThread(settings_from(_config(upstreams))) as server:
        chat = openai.OpenAI(base_url=server.base_url, api_key=CLIENT, max_retries=0)
        claude = anthropic.Anthropic(base_url=server.url, api_key=CLIENT, max_retries=0)
        assert {m.id for m in chat.models.list()} == {"mixed", "claude", "gpt"}
        assert {m.id for m in claude.models.list()} == {"mixed", "claude"}
        with pytest.raises(anthropic.NotFoundError):
            claude.models.retrieve("gpt")
        with pytest.raises(anthropic.BadRequestError) as unsupported:
            claude.messages.create(model="gpt", max_tokens=5, messages=USER)
        assert "not served through the messages API" in unsupported.value.response.text
