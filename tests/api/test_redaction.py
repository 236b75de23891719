"""The deployment's upstream key never reaches a client, whatever the upstream quotes:
an echoing upstream (some OpenAI-compatible servers quote the credentials they got in
their errors) answers 400, 404 and 422, plain and streamed, and a streamed 200 whose
chunks quote it; the client sees the key nowhere, in bodies or headers.

And redaction never changes an answer that does not quote the key as a credential:
with the dummy keys people put before local servers (``x``, ``token``, ``none``,
``EMPTY``), chat answers (plain, streamed cut into 7-byte chunks) and base64 embeddings
read by the openai SDK reach the client byte for byte as the upstream sent them."""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer, chunked
from support.scripted_upstream import ScriptedUpstream

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.upstream.redact import REDACTED

SECRET = "sk-deploy-secret-0123456789"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, api_key=SECRET)) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    deployment = {"id": "d", "base_url": upstream.base_url, "api_key": SECRET}
    config = {"models": [{"name": "m", "deployments": [deployment]}], "routing": {"retries": 0}}
    with ProxyInThread(settings_from(config)) as server:
        yield server


def _everything(response: httpx.Response) -> str:
    return response.text + "".join(f"{k}: {v}\n" for k, v in response.headers.items())


@pytest.mark.parametrize("status", [400, 404, 422])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_upstream_error_quoting_the_key_reaches_the_client_without_it(
    proxy: ProxyInThread,
    upstream: FakeUpstreamHandle,
    caplog: pytest.LogCaptureFixture,
    status: int,
    stream: bool,
) -> None:
    upstream.control(echo_status=status)
    try:
        with caplog.at_level(logging.DEBUG):
            response = httpx.post(
                f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": stream}, timeout=10
            )
    finally:
        upstream.control(echo_status=None)
    assert response.status_code == status
    assert SECRET not in _everything(response)
    assert REDACTED in response.json()["error"]["message"]
    assert REDACTED in response.headers["openai-model"]
    assert SECRET not in caplog.text


def test_a_stream_quoting_the_key_across_two_chunks_reaches_the_client_without_it(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(echo_status=200)
    try:
        with httpx.stream(
            "POST", f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            chunks = list(response.iter_raw())
    finally:
        upstream.control(echo_status=None)
    text = b"".join(chunks).decode()
    assert response.status_code == 200
    assert SECRET not in text and REDACTED in text
    assert text.rstrip().endswith("data: [DONE]")


# --- dummy keys: the answer is the upstream's, byte for byte ---------------------------

DUMMY_KEYS = ["x", "token", "none", "EMPTY"]
# Words, base64 and usage fields that contain every dummy key, inside words or alone.
WORDY = "none of the tokens were EMPTY; x marks the index, token by token"
CHAT_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-token",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": WORDY},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }
)
EMBEDDING = [i * 0.0137 - 0.8 for i in range(128)]  # its base64 holds "x" six times
CHUNKS = [
    {"index": 0, "delta": {"role": "assistant", "content": WORDY}, "finish_reason": None},
    {"index": 0, "delta": {}, "finish_reason": "stop"},
]


def _event(choices: list[dict[str, object]], usage: object = None) -> bytes:
    chunk = {"id": "c-token", "object": "chat.completion.chunk", "model": "m"}
    chunk |= {"choices": choices, "usage": usage}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


STREAM_ANSWER = (
    b"".join(_event([c]) for c in CHUNKS)
    + _event([], {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12})
    + b"data: [DONE]\n\n"
)


def _embeddings_answer() -> bytes:
    vector = base64.b64encode(struct.pack(f"<{len(EMBEDDING)}f", *EMBEDDING)).decode()
    assert "x" in vector  # the base64 holds a dummy key
    data = [{"object": "embedding", "index": 0, "embedding": vector}]
    usage = {"prompt_tokens": 3, "total_tokens": 3}
    return orjson.dumps({"object": "list", "data": data, "model": "m", "usage": usage})


async def _fixed_answers(conversation: Conversation) -> None:
    request = orjson.loads(conversation.request.body)
    if conversation.request.request_line.split()[1].endswith("/embeddings"):
        await conversation.send(answer(_embeddings_answer(), "content-type: application/json"))
    elif request.get("stream") is True:
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        await conversation.send(head.encode() + b"transfer-encoding: chunked\r\n\r\n")
        for at in range(0, len(STREAM_ANSWER), 7):  # cut everywhere, keys split too
            await conversation.send(chunked(STREAM_ANSWER[at : at + 7]))
        await conversation.send(b"0\r\n\r\n")
    else:
        await conversation.send(answer(CHAT_ANSWER, "content-type: application/json"))


@pytest.fixture(scope="module")
def dummy_keyed(serving_path: str) -> Iterator[ProxyInThread]:
    """One model per dummy key (``m-<key>``), all before the same scripted upstream."""
    with ScriptedUpstream(_fixed_answers) as upstream:
        models = [
            {
                "name": f"m-{key}",
                "deployments": [{"id": f"d-{key}", "base_url": upstream.url, "api_key": key}],
            }
            for key in DUMMY_KEYS
        ]
        with ProxyInThread(settings_from({"models": models})) as server:
            yield server


@pytest.mark.parametrize("key", DUMMY_KEYS)
def test_a_dummy_key_leaves_chat_answers_as_the_upstream_sent_them(
    dummy_keyed: ProxyInThread, key: str
) -> None:
    chat = {**CHAT, "model": f"m-{key}"}
    plain = httpx.post(f"{dummy_keyed.base_url}/chat/completions", json=chat)
    assert plain.status_code == 200 and plain.content == CHAT_ANSWER
    client = openai.OpenAI(base_url=dummy_keyed.base_url, api_key="unused", max_retries=0)
    completion = client.chat.completions.create(**chat)  # type: ignore[call-overload]
    assert completion.choices[0].index == 0
    assert completion.usage.prompt_tokens == 5
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream(
        "POST", f"{dummy_keyed.base_url}/chat/completions", json=streamed
    ) as response:
        assert response.read() == STREAM_ANSWER


@pytest.mark.parametrize("key", DUMMY_KEYS)
def test_a_dummy_key_leaves_base64_embeddings_intact_for_the_openai_sdk(
    dummy_keyed: ProxyInThread, key: str
) -> None:
    client = openai.OpenAI(base_url=dummy_keyed.base_url, api_key="unused", max_retries=0)
    for _ in range(5):  # the issue: 6 of 20 calls raised "Invalid base64-encoded string"
        result = client.embeddings.create(model=f"m-{key}", input="hi")  # base64 on the wire
        assert result.data[0].embedding == pytest.approx(EMBEDDING, rel=1e-6)
        assert result.data[0].index == 0
