"""The fake upstream's Bedrock: boto3's ``bedrock-runtime`` client (SigV4, its paths, its
event stream decoder) is its client, so its shapes are Bedrock's."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

from proxy.fake_upstream import FakeUpstreamHandle

KEY_ID = "AKIDFAKEUPSTREAM0001"
SECRET = "fake/upstream+secret0123456789abcdefghij"
MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}


def _client(upstream: FakeUpstreamHandle, secret: str = SECRET) -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-west-2",
        endpoint_url=upstream.url,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


def _body(**more: Any) -> str:
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "Hello"}],
        **more,
    }
    return json.dumps(body)


@pytest.fixture
def client(upstream: FakeUpstreamHandle) -> Iterator[Any]:
    yield _client(upstream)


def test_invoke_model_answers_a_message(client: Any, upstream: FakeUpstreamHandle) -> None:
    answer = client.invoke_model(modelId=MODEL, body=_body())
    message = json.loads(answer["body"].read())
    assert message["type"] == "message" and message["model"] == MODEL
    assert message["usage"]["output_tokens"] > 0
    assert upstream.stats()["last_request"]["path"].startswith("/model/us.anthropic.")


def test_a_streamed_invoke_is_an_event_stream_of_the_messages_events(client: Any) -> None:
    answer = client.invoke_model_with_response_stream(modelId=MODEL, body=_body())
    events = [json.loads(part["chunk"]["bytes"]) for part in answer["body"]]
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds
    assert "amazon-bedrock-invocationMetrics" in events[-1]


def test_a_wrong_secret_is_an_invalid_signature(upstream: FakeUpstreamHandle) -> None:
    with pytest.raises(ClientError) as raised:
        _client(upstream, secret="not/the+secret0123456789abcdefghijklmn").invoke_model(
            modelId=MODEL, body=_body()
        )
    assert raised.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_an_unsigned_request_is_refused(upstream: FakeUpstreamHandle) -> None:
    answer = httpx.post(f"{upstream.url}/model/{MODEL}/invoke", content=_body())
    assert answer.status_code == 403
    assert answer.headers["x-amzn-errortype"].startswith("MissingAuthenticationTokenException")


def test_model_and_stream_in_the_body_are_refused(client: Any) -> None:
    with pytest.raises(ClientError) as raised:
        client.invoke_model(modelId=MODEL, body=_body(model="claude", stream=True))
    assert raised.value.response["Error"]["Code"] == "ValidationException"


def test_a_full_window_is_a_throttling_exception(client: Any, upstream: FakeUpstreamHandle) -> None:
    upstream.control(rpm=1)
    client.invoke_model(modelId=MODEL, body=_body())
    with pytest.raises(ClientError) as raised:
        client.invoke_model(modelId=MODEL, body=_body())
    assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429


def test_a_failure_is_a_service_unavailable_exception(
    client: Any, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(fail_rate=1.0, fail_status=503)
    with pytest.raises(ClientError) as raised:
        client.invoke_model(modelId=MODEL, body=_body())
    assert raised.value.response["Error"]["Code"] == "ServiceUnavailableException"


def test_a_stream_may_end_in_a_throttling_exception(
    client: Any, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(error_after_chunks=2)
    answer = client.invoke_model_with_response_stream(modelId=MODEL, body=_body())
    parts = []
    with pytest.raises(EventStreamError) as raised:
        parts.extend(answer["body"])
    assert raised.value.response["Error"]["Code"] == "throttlingException"
    assert len(parts) == 2


CONVERSE_MODEL = "meta.llama3-70b-instruct-v1:0"
TURNS = [{"role": "user", "content": [{"text": "Hello"}]}]


def test_converse_answers_a_message(client: Any) -> None:
    answer = client.converse(
        modelId=CONVERSE_MODEL,
        messages=TURNS,
        system=[{"text": "Be brief."}],
        inferenceConfig={"maxTokens": 20},
    )
    assert answer["output"]["message"]["content"][0]["text"]
    assert answer["stopReason"] in ("end_turn", "max_tokens")
    assert answer["usage"]["outputTokens"] > 0


def test_converse_stream_sends_its_events_with_the_usage_last(client: Any) -> None:
    answer = client.converse_stream(modelId=CONVERSE_MODEL, messages=TURNS)
    events = list(answer["stream"])
    kinds = [next(iter(event)) for event in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    assert "contentBlockDelta" in kinds
    assert events[-1]["metadata"]["usage"]["outputTokens"] > 0


PIXEL = bytes.fromhex(  # a 1x1 transparent PNG
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63606060f80f0002870180eb47ba920000000049454e44ae426082"
)
TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "weather",
                "description": "The weather in a city.",
                "inputSchema": {"json": {"type": "object", "properties": {}}},
            }
        }
    ],
    "toolChoice": {"any": {}},
}


def test_converse_answers_tools_with_a_tool_use_then_its_result_with_text(
    client: Any, upstream: FakeUpstreamHandle
) -> None:
    # boto3 sends the image's bytes base64-encoded on Converse's JSON wire.
    image = {"image": {"format": "png", "source": {"bytes": PIXEL}}}
    asked = [{"role": "user", "content": [{"text": "Weather here?"}, image]}]
    answer = client.converse(modelId=CONVERSE_MODEL, messages=asked, toolConfig=TOOLS)
    sent = upstream.stats()["last_request"]["body"]["messages"][0]["content"][1]
    assert sent["image"]["source"]["bytes"] == base64.b64encode(PIXEL).decode()
    use = answer["output"]["message"]["content"][0]["toolUse"]
    assert answer["stopReason"] == "tool_use" and use["name"] == "weather"
    assert isinstance(use["input"], dict) and use["toolUseId"]
    result = {"toolResult": {"toolUseId": use["toolUseId"], "content": [{"text": "Sunny"}]}}
    turns = [*asked, answer["output"]["message"], {"role": "user", "content": [result]}]
    auto = {**TOOLS, "toolChoice": {"auto": {}}}  # (any: a call again, whatever came)
    final = client.converse(modelId=CONVERSE_MODEL, messages=turns, toolConfig=auto)
    assert final["stopReason"] != "tool_use"
    assert final["output"]["message"]["content"][0]["text"]


def test_converse_stream_sends_a_tool_use_as_its_start_and_input_pieces(client: Any) -> None:
    answer = client.converse_stream(modelId=CONVERSE_MODEL, messages=TURNS, toolConfig=TOOLS)
    events = list(answer["stream"])
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "weather"
    pieces = [e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events
              if "contentBlockDelta" in e]  # fmt: skip
    assert isinstance(json.loads("".join(pieces)), dict)
    assert next(e["messageStop"] for e in events if "messageStop" in e)["stopReason"] == "tool_use"


USE = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": "w", "input": {}}}]}
RESULT = {
    "role": "user",
    "content": [{"toolResult": {"toolUseId": "t", "content": [{"text": "x"}]}}],
}


@pytest.mark.parametrize(
    "turns",
    [
        [*TURNS, *TURNS],  # roles that do not alternate
        [*TURNS, USE, RESULT],  # tool blocks without a toolConfig
        [{"role": "user", "content": [{"text": " "}]}],  # a blank text
    ],
)  # fmt: skip
def test_converse_refuses_what_bedrock_validates(client: Any, turns: list[Any]) -> None:
    with pytest.raises(ClientError) as refused:
        client.converse(modelId=CONVERSE_MODEL, messages=turns)
    assert refused.value.response["Error"]["Code"] == "ValidationException"


def test_invoke_model_takes_beta_flags_as_a_list_only(client: Any) -> None:
    answer = client.invoke_model(modelId=MODEL, body=_body(anthropic_beta=["context-1m"]))
    assert json.loads(answer["body"].read())["type"] == "message"
    with pytest.raises(ClientError) as refused:
        client.invoke_model(modelId=MODEL, body=_body(anthropic_beta="context-1m"))
    assert refused.value.response["Error"]["Code"] == "ValidationException"
