"""AWS Bedrock deployments, end to end: the official anthropic SDK, pointed at the proxy,
through a ``provider: bedrock`` deployment to the fake upstream's Bedrock, which checks
each request's SigV4 signature (recomputed with botocore from the same keys), takes the
Messages body as Bedrock does and streams AWS's event stream. Served, streamed, paced to
a strict upstream window, its throttling learned, its secret never shown; on the
in-memory limiter and on Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY_ID = "AKIDBEDROCKPROXY0001"
SECRET = "bedrock/proxy+secret0123456789abcdefghij"
TOKEN = "session-token-0123456789abcdefghijklmnop"
MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
ADMIN = "admin-secret"
CLIENT = "sk-client-bedrock"
HEADERS = {"x-api-key": CLIENT}
MESSAGES: list[Any] = [{"role": "user", "content": "Hello there, Bedrock!"}]
BODY: dict[str, Any] = {"model": "claude", "max_tokens": 20, "messages": MESSAGES}


def _upstream(**options: Any) -> FakeUpstreamHandle:
    config = FakeUpstreamConfig(
        port=0,
        chunk_delay=0.001,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        **options,
    )
    return run_in_thread(config)


def _bedrock(upstream: FakeUpstreamHandle, name: str = "bedrock", **extra: Any) -> dict[str, Any]:
    return {
        "id": name,
        "provider": "bedrock",
        "base_url": upstream.url,
        "model": MODEL,
        "region": "us-west-2",
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_session_token": TOKEN,
        **extra,
    }


def _config(deployments: list[dict[str, Any]], limiter_url: str = "") -> dict[str, Any]:
    """``limiter_url``: "" for the in-memory limiter, or a Redis URL."""
    return {
        "models": [{"name": "claude", "deployments": deployments}],
        "routing": {"retries": 1, "max_wait": "10s"},
        "admin": {"keys": [ADMIN]},
        "keys": [{"name": "app", "key": CLIENT}],
        "redis": {"url": limiter_url},
    }


def _sdk(proxy: ProxyInThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT, max_retries=0)


def test_the_anthropic_sdk_is_served_and_streamed_through_bedrock() -> None:
    with _upstream() as upstream, ProxyInThread(settings_from(_config([_bedrock(upstream)]))) as p:
        message = _sdk(p).messages.create(**BODY)
        sent = upstream.stats()["last_request"]
        with _sdk(p).messages.stream(**BODY) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    # The model in the URL, the request signed (over its path as escaped), its body
    # Bedrock's: no model, no stream, Bedrock's anthropic_version.
    assert sent["path"] == f"/model/{MODEL}/invoke"
    assert sent["headers"]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    assert "/us-west-2/bedrock/aws4_request" in sent["headers"]["authorization"]
    assert sent["headers"]["x-amz-security-token"] == TOKEN
    assert "model" not in sent["body"] and "stream" not in sent["body"]
    assert sent["body"]["anthropic_version"] == "bedrock-2023-05-31"
    assert text and final.usage.output_tokens > 0 and final.stop_reason == "end_turn"
    assert upstream.stats()["by_status"] == {"200": 2}


@pytest.mark.serial  # pacing to a strict window: late turns on a loaded host are misses
def test_a_burst_is_paced_to_bedrocks_window_without_a_throttle(limiter_url: str) -> None:
    # The upstream takes 4 requests in any 2 s, strictly; the deployment says 120 a
    # minute: the proxy paces 8 to that and Bedrock throttles none.
    with _upstream(rpm=4, window=2.0) as upstream:
        config = _config([_bedrock(upstream, rpm=120)], limiter_url)
        with ProxyInThread(settings_from(config)) as proxy:
            statuses = asyncio.run(_burst(proxy.url, 8))
        stats = upstream.stats()
    assert statuses == [200] * 8
    assert (stats["served"], stats["rejected"]) == (8, 0)


async def _burst(url: str, n: int) -> list[int]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    f"{url}/v1/messages", json={**BODY, "stream": i % 2 == 0}, headers=HEADERS
                )
                for i in range(n)
            )
        )
    return [a.status_code for a in answers]


def test_a_throttling_exception_holds_the_deployment_as_a_429_does(limiter_url: str) -> None:
    """Bedrock's 429 ThrottlingException (no retry-after) holds the deployment: the
    requests after it go to the other one, none reaches it meanwhile."""
    with _upstream(rpm=1, window=60.0) as limited, _upstream() as good:
        deployments = [_bedrock(limited, "limited", weight=1e9), _bedrock(good, "good")]
        with ProxyInThread(settings_from(_config(deployments, limiter_url))) as proxy:
            answers = [_sdk(proxy).messages.create(**BODY) for _ in range(5)]
    assert all(a.content for a in answers)
    assert limited.stats()["by_status"] == {"200": 1, "429": 1}
    assert good.stats()["served"] == 4


def test_a_service_unavailable_exception_is_learned_as_throttling(limiter_url: str) -> None:
    """A 503 ServiceUnavailableException is Bedrock's way of throttling too: the client
    hears the deployment is rate limited, and it is held (the next request not sent)."""
    with _upstream(fail_rate=1.0, fail_status=503) as upstream:
        config = _config([_bedrock(upstream)], limiter_url)
        config["routing"].update(retries=0, max_wait="0s")
        with ProxyInThread(settings_from(config)) as proxy:
            refused = httpx.post(f"{proxy.url}/v1/messages", json=BODY, headers=HEADERS, timeout=10)
            again = httpx.post(f"{proxy.url}/v1/messages", json=BODY, headers=HEADERS, timeout=10)
        stats = upstream.stats()
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "overloaded_error" or "rate" in refused.text
    assert again.status_code in (429, 503)
    assert stats["requests"] == 1  # held: the second never reached Bedrock


def test_the_aws_secret_and_signature_are_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    """Served, streamed, refused (a wrong secret: Bedrock's 403): the secret, the session
    token and the signature appear in no log line, answer, metric or /admin/state."""
    caplog.set_level(logging.DEBUG)
    with _upstream() as upstream:
        config = _config([_bedrock(upstream)])
        wrong = _bedrock(upstream, "wrong", aws_secret_access_key="not-" + SECRET)
        config["models"].append({"name": "wrong", "deployments": [wrong]})
        with ProxyInThread(settings_from(config)) as proxy:
            url = f"{proxy.url}/v1/messages"
            seen = [httpx.post(url, json=BODY, headers=HEADERS, timeout=10)]
            signature = upstream.stats()["last_request"]["headers"]["authorization"]
            seen.append(httpx.post(url, json={**BODY, "stream": True}, headers=HEADERS))
            seen.append(httpx.post(url, json={**BODY, "model": "wrong"}, headers=HEADERS))
            admin = {"authorization": f"Bearer {ADMIN}"}
            seen.append(httpx.get(f"{proxy.url}/admin/state", headers=admin, timeout=10))
            seen.append(httpx.get(f"{proxy.url}/metrics", timeout=10))
    assert [r.status_code for r in seen[:2]] == [200, 200]
    assert seen[2].status_code == 502 and "credentials" in seen[2].text
    shown = "\n".join(r.text + str(dict(r.headers)) for r in seen) + caplog.text
    signature_hex = signature.rsplit("Signature=", 1)[1]
    for secret in (SECRET, "not-" + SECRET, TOKEN, signature_hex):
        assert secret not in shown


def test_chat_clients_reach_bedrock_through_the_messages_translation() -> None:
    """The openai SDK's chat completions reach a Bedrock deployment (which speaks only
    the Messages API) translated, plain and streamed, its usage read."""
    with _upstream() as upstream, ProxyInThread(settings_from(_config([_bedrock(upstream)]))) as p:
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key=CLIENT, max_retries=0)
        chat = {"model": "claude", "messages": MESSAGES, "max_tokens": 20}
        answer = client.chat.completions.create(**chat)
        chunks = list(
            client.chat.completions.create(
                **chat, stream=True, stream_options={"include_usage": True}
            )
        )
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert upstream.stats()["by_status"] == {"200": 2}


def test_chat_clients_reach_any_model_through_bedrocks_converse_api() -> None:
    """A ``bedrock-converse`` deployment (a model Bedrock serves through Converse only)
    serves the openai SDK's chat completions translated, plain and streamed, its usage
    read; what Converse has no counterpart for is a 400 naming the field."""
    converse = _bedrock(upstream := _upstream(), provider="bedrock-converse")
    converse["model"] = "meta.llama3-70b-instruct-v1:0"
    with upstream, ProxyInThread(settings_from(_config([converse]))) as p:
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key=CLIENT, max_retries=0)
        system = {"role": "system", "content": "Be brief."}
        chat = {"model": "claude", "messages": [system, *MESSAGES], "max_tokens": 20}
        answer = client.chat.completions.create(**chat)
        sent = upstream.stats()["last_request"]
        chunks = list(
            client.chat.completions.create(
                **chat, stream=True, stream_options={"include_usage": True}
            )
        )
        tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**chat, tools=[tool], tool_choice="none")
    assert sent["path"] == "/model/meta.llama3-70b-instruct-v1:0/converse"
    assert sent["body"]["system"] == [{"text": "Be brief."}]
    assert sent["body"]["inferenceConfig"] == {"maxTokens": 20}
    assert "model" not in sent["body"]
    assert answer.choices[0].message.content and answer.choices[0].finish_reason
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert refused.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert upstream.stats()["by_status"] == {"200": 2}


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PIXEL = (  # a 1x1 transparent PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def test_a_tool_call_through_converse_plain_and_streamed_then_its_result() -> None:
    """The openai SDK's tools reach a Converse deployment as its toolConfig: the tool call
    comes back plain and streamed as chat's tool_calls; the call and its result sent back
    (an image beside the question) get the model's text."""
    converse = _bedrock(upstream := _upstream(), provider="bedrock-converse")
    converse["model"] = "meta.llama3-70b-instruct-v1:0"
    question = [
        {"type": "text", "text": "What is the weather where this was taken?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
    ]
    messages: list[Any] = [{"role": "user", "content": question}]
    with upstream, ProxyInThread(settings_from(_config([converse]))) as p:
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key=CLIENT, max_retries=0)
        chat: dict[str, Any] = {"model": "claude", "max_tokens": 20, "tools": [WEATHER]}
        answer = client.chat.completions.create(**chat, messages=messages, tool_choice="required")
        sent = upstream.stats()["last_request"]["body"]
        chunks = list(client.chat.completions.create(**chat, messages=messages, stream=True))
        call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."},
        ]
        final = client.chat.completions.create(**chat, messages=messages)
        answered = upstream.stats()["last_request"]["body"]
    assert sent["toolConfig"]["tools"][0]["toolSpec"]["name"] == "weather"
    assert sent["toolConfig"]["toolChoice"] == {"any": {}}
    image = sent["messages"][0]["content"][1]["image"]
    assert image == {"format": "png", "source": {"bytes": PIXEL}}
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "weather" and call.id  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
    streamed = [c.choices[0] for c in chunks if c.choices]
    pieces = [d for c in streamed for d in c.delta.tool_calls or ()]
    assert pieces[0].id and pieces[0].function.name == "weather"  # type: ignore[union-attr]
    arguments = "".join(d.function.arguments or "" for d in pieces)  # type: ignore[union-attr]
    assert isinstance(json.loads(arguments), dict)
    assert streamed[-1].finish_reason == "tool_calls"
    result = answered["messages"][-1]["content"][0]["toolResult"]
    assert result == {"toolUseId": call.id, "content": [{"text": "Sunny, 21 C."}]}
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert upstream.stats()["by_status"] == {"200": 3}


def test_the_anthropic_beta_header_reaches_invokemodel_in_the_body() -> None:
    """Bedrock reads beta flags from InvokeModel's body, not a header: the anthropic SDK's
    ``anthropic-beta`` header arrives as the body's ``anthropic_beta`` list."""
    with _upstream() as upstream, ProxyInThread(settings_from(_config([_bedrock(upstream)]))) as p:
        betas = {"anthropic-beta": "context-1m-2025-08-07, token-efficient-tools-2025-02-19"}
        _sdk(p).messages.create(**BODY, extra_headers=betas)
        sent = upstream.stats()["last_request"]["body"]
        _sdk(p).messages.create(**BODY)
        without = upstream.stats()["last_request"]["body"]
    assert sent["anthropic_beta"] == ["context-1m-2025-08-07", "token-efficient-tools-2025-02-19"]
    assert "anthropic_beta" not in without
