"""Bedrock's provider alone (pure, and botocore's signer): the URL and body InvokeModel
takes, the signature, its throttling read from its headers, and its event stream
reframed into the Messages API's events, including what a lying upstream sends."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import zlib

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from proxy.config.settings import AwsConfig
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.providers.bedrock import BEDROCK, BedrockWire, Reframer
from proxy.providers.eventstream import MAX_MESSAGE, MessageReader, encode_message
from proxy.upstream.encoding import Undecodable

AWS = AwsConfig(
    region="eu-central-1",
    access_key_id=SecretStr("AKIDUNITTEST00000001"),
    secret_access_key=SecretStr("unit/test+secret0123456789abcdefghijklmn"),
    session_token=SecretStr(""),
    profile="",
)
CHAIN = AwsConfig("us-east-1", SecretStr(""), SecretStr(""), SecretStr(""), "")
CHUNK = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}


def _chunk(event: dict[str, object]) -> bytes:
    part = {"bytes": base64.b64encode(orjson.dumps(event)).decode()}
    return encode_message(CHUNK, orjson.dumps(part))


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("anthropic.claude-3-haiku-20240307-v1:0", "anthropic.claude-3-haiku-20240307-v1%3A0"),
        ("us.anthropic.claude-sonnet-4-v1:0", "us.anthropic.claude-sonnet-4-v1%3A0"),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.x-v1:0",
            "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.x-v1%3A0",
        ),
    ],
)
def test_the_model_id_is_escaped_in_the_url_as_botocore_escapes_it(model: str, path: str) -> None:
    wire = BedrockWire("https://bedrock-runtime.eu-central-1.amazonaws.com", AWS)
    url, body = wire.outgoing("messages", model, True, b'{"model":"m","stream":true}')
    assert url.endswith(f"/model/{path}/invoke-with-response-stream")
    assert orjson.loads(body) == {"anthropic_version": "bedrock-2023-05-31"}


def test_without_a_deployment_model_the_clients_is_sent_and_a_bad_body_refused() -> None:
    wire = BedrockWire("http://b", AWS)
    url, _ = wire.outgoing("messages", None, False, b'{"model":"claude-x","max_tokens":1}')
    assert url == "http://b/model/claude-x/invoke"
    for payload in (b"[]", b'{"max_tokens":1}'):
        with pytest.raises(InvalidRequest):
            wire.outgoing("messages", None, False, payload)


def test_a_request_is_signed_over_its_own_headers_only() -> None:
    wire = BedrockWire("http://b", AWS)
    headers = {"Content-Type": "text/plain", "x-amz-date": "forged", "anthropic-beta": "x"}
    asyncio.run(wire.authorize("POST", "http://b/model/m/invoke", headers, b"{}"))
    assert headers["content-type"] == "application/json" and "Content-Type" not in headers
    assert headers["x-amz-date"] != "forged" and headers["anthropic-beta"] == "x"
    signed = headers["authorization"].split("SignedHeaders=")[1].split(",")[0]
    assert signed == "accept;content-type;host;x-amz-date"
    assert "/eu-central-1/bedrock/aws4_request" in headers["authorization"]


def test_no_credentials_anywhere_is_an_unreachable_deployment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    wire = BedrockWire("http://b", CHAIN)
    with pytest.raises(UpstreamUnavailable):
        asyncio.run(wire.authorize("POST", "http://b/model/m/invoke", {}, b"{}"))


def test_the_default_chain_finds_credentials_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENVIRONMENT1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from/the+environment0123456789abcdefghi")
    wire = BedrockWire("http://b", CHAIN)
    headers: dict[str, str] = {}
    asyncio.run(wire.authorize("POST", "http://b/model/m/invoke", headers, b"{}"))
    assert "Credential=AKIDFROMENVIRONMENT1/" in headers["authorization"]


@pytest.mark.parametrize(
    ("status", "errortype", "throttled"),
    [
        (429, "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/", True),
        (429, "ModelNotReadyException", True),
        (503, "ServiceUnavailableException:http://x/", True),
        (500, "InternalServerException", False),
        (400, "ValidationException", False),
        (503, "ServiceUnavailableExceptionX", False),
    ],
)
def test_its_throttling_is_read_from_the_error_type(
    status: int, errortype: str, throttled: bool
) -> None:
    budget = BEDROCK.budget({"x-amzn-errortype": errortype}, 0.0)
    assert budget.throttled is throttled and budget.empty
    assert BEDROCK.budget({}, 0.0).throttled is False


def test_an_unresolvable_model_id_is_the_configs_fault_unless_the_client_named_it() -> None:
    body = b'{"message":"The provided model identifier is invalid."}'
    assert BEDROCK.misconfigured(400, body, 30.0) is not None
    assert BEDROCK.misconfigured(400, body, 30.0, asked=True) is None
    assert BEDROCK.misconfigured(400, b'{"message":"max_tokens: too big"}', 30.0) is None
    assert BEDROCK.misconfigured(404, b'{"message":"no"}', 30.0) is not None


def test_chunks_become_the_messages_events_however_the_bytes_are_cut() -> None:
    events = [{"type": "message_start", "message": {"usage": {"input_tokens": 3}}}]
    events.append({"type": "message_stop", "amazon-bedrock-invocationMetrics": {"x": 1}})
    stream = b"".join(_chunk(e) for e in events)
    for cut in (1, 7, 13, len(stream)):
        reframer = Reframer()
        out = [e for at in range(0, len(stream), cut) for e in reframer.feed(stream[at : at + cut])]
        reframer.end()
        assert out == [
            b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            for e in events
        ]


def test_botocore_reads_the_messages_written() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(_chunk({"type": "ping"}))
    (message,) = list(buffer)
    assert message.headers[":event-type"] == "chunk"
    assert orjson.loads(base64.b64decode(orjson.loads(message.payload)["bytes"])) == {
        "type": "ping"
    }


def test_an_exception_ends_the_stream_with_the_messages_error_event() -> None:
    exception = encode_message(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"Too many requests"}',
    )
    reframer = Reframer()
    out = reframer.feed(_chunk({"type": "ping"}) + exception + _chunk({"type": "ping"}))
    assert len(out) == 2 and out[1].startswith(b"event: error\n")
    assert orjson.loads(out[1].split(b"data: ")[1])["error"]["type"] == "overloaded_error"


def _corrupt(frame: bytes, at: int) -> bytes:
    return frame[:at] + bytes([frame[at] ^ 0xFF]) + frame[at + 1 :]


@pytest.mark.parametrize(
    "liar",
    [
        _corrupt(_chunk({"type": "ping"}), 2),  # the prelude's length: its CRC fails
        _corrupt(_chunk({"type": "ping"}), 30),  # a header's byte: the message CRC fails
        _chunk({"type": "bad\ntype"}),  # an event type that would split the SSE line
        _chunk({"no": "type"}),
        encode_message(CHUNK, b'{"bytes":"not base64!"}'),
        encode_message(CHUNK, b'{"bytes":"' + base64.b64encode(b"[1]") + b'"}'),
        encode_message({":message-type": "unheard-of"}, b""),
    ],
)
def test_a_lying_frame_is_undecodable(liar: bytes) -> None:
    with pytest.raises(Undecodable):
        Reframer().feed(liar)


def test_a_huge_announced_message_is_refused_before_it_is_read() -> None:
    prelude = struct.pack(">II", MAX_MESSAGE + 1, 0)
    prelude += struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(Undecodable):
        MessageReader().feed(prelude)


def test_a_stream_cut_inside_a_message_is_undecodable() -> None:
    reframer = Reframer()
    assert reframer.feed(_chunk({"type": "ping"})[:-3]) == []
    with pytest.raises(Undecodable):
        reframer.end()


@given(st.binary(max_size=200))
def test_any_bytes_are_messages_or_undecodable(data: bytes) -> None:
    with contextlib.suppress(Undecodable):
        MessageReader().feed(data)


def test_converse_stream_events_pass_as_their_own_events() -> None:
    headers = {":event-type": "contentBlockDelta", ":message-type": "event"}
    delta = {"contentBlockIndex": 0, "delta": {"text": "hi"}}
    out = Reframer().feed(encode_message(headers, orjson.dumps(delta)))
    assert out == [b"event: contentBlockDelta\ndata: " + orjson.dumps(delta) + b"\n\n"]
    for liar in (
        encode_message({**headers, ":event-type": "bad type"}, b"{}"),
        encode_message(headers, b"[1]"),
    ):
        with pytest.raises(Undecodable):
            Reframer().feed(liar)


def test_a_converse_deployment_is_sent_to_converse_without_anthropic_version() -> None:
    wire = BedrockWire("http://b", AWS)
    url, body = wire.outgoing("converse", "meta.llama3-8b-instruct-v1:0", True, b'{"model":"x"}')
    assert url == "http://b/model/meta.llama3-8b-instruct-v1%3A0/converse-stream"
    assert orjson.loads(body) == {}


def test_the_clients_anthropic_beta_header_is_carried_in_invokemodels_body() -> None:
    """Bedrock reads beta flags from the body's ``anthropic_beta`` only: every header's
    comma-separated flags, trimmed, each once, after the body's own."""
    wire = BedrockWire("http://b", AWS)
    headers = [
        ("Anthropic-Beta", " context-1m-2025-08-07 ,interleaved-thinking-2025-05-14"),
        ("x-other", "a,b"),
        ("anthropic-beta", "context-1m-2025-08-07,, token-efficient-tools-2025-02-19"),
    ]
    _, body = wire.outgoing("messages", "m", False, b'{"max_tokens":1}')
    carried = orjson.loads(wire.carried("messages", headers, body))
    assert carried["anthropic_beta"] == [
        "context-1m-2025-08-07",
        "interleaved-thinking-2025-05-14",
        "token-efficient-tools-2025-02-19",
    ]
    assert carried["anthropic_version"] == "bedrock-2023-05-31"
    own = b'{"anthropic_beta":["computer-use-2025-01-24","context-1m-2025-08-07"]}'
    merged = orjson.loads(wire.carried("messages", headers[:1], own))["anthropic_beta"]
    assert merged == [
        "computer-use-2025-01-24",
        "context-1m-2025-08-07",
        "interleaved-thinking-2025-05-14",
    ]
    # No flags, or Converse (a translated chat request): the body as it was.
    assert wire.carried("messages", [("anthropic-beta", " , ")], body) is body
    assert wire.carried("converse", headers, b"{}") == b"{}"


@pytest.mark.parametrize("given", [b'{"anthropic_beta":"x"}', b'{"anthropic_beta":[1]}'])
def test_a_body_anthropic_beta_that_is_no_list_of_strings_is_refused(given: bytes) -> None:
    with pytest.raises(InvalidRequest) as refused:
        BedrockWire("http://b", AWS).carried("messages", [("anthropic-beta", "x")], given)
    assert refused.value.param == "anthropic_beta"
