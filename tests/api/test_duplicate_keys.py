"""A body with a key twice in one object, at any depth, through the real proxy to a
scripted upstream on loopback: refused with a 400 in the API's error shape naming the
key, and nothing reaches the upstream. The proxy judges the parse (orjson keeps the last
of two) while it forwards the bytes (an upstream may read the first): a key's
``previous_response_id`` of another key, a model off the allow-list, a larger output cap
than the budget reserved. The SDKs cannot send such a body: raw bytes do."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer
from support.scripted_upstream import ScriptedUpstream

ALICE = "sk-dup-alice"
BOB = "sk-dup-bob"
BUDGET = "sk-dup-budget"
JSON = "content-type: application/json"

CHAT = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
)
COMPLETION = orjson.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
)
EMBEDDING = orjson.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
        "model": "m",
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
)
MESSAGE = orjson.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
)


class Upstream:
    """Answers each API's create; a Responses create gets a new id each time."""

    def __init__(self) -> None:
        self.ids = (f"resp_{n:04d}" for n in itertools.count())

    async def __call__(self, conversation: Conversation) -> None:
        path = conversation.request.request_line.split()[1]
        if path.endswith("/responses"):
            rid = next(self.ids)
            usage = {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}
            body = {"id": rid, "object": "response", "status": "completed", "output": []}
            await conversation.send(answer(orjson.dumps({**body, "usage": usage}), JSON))
            return
        canned = {
            "/v1/chat/completions": CHAT,
            "/v1/completions": COMPLETION,
            "/v1/embeddings": EMBEDDING,
            "/v1/messages": MESSAGE,
        }[path]
        await conversation.send(answer(canned, JSON))


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(Upstream()) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(upstream: ScriptedUpstream) -> Iterator[ProxyInThread]:
    config = {
        "keys": [
            {"name": "alice", "key": ALICE},
            {"name": "bob", "key": BOB, "models": ["m"]},
            {"name": "budget", "key": BUDGET, "budgets": [{"tokens": 1000, "period": "day"}]},
        ],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": f"{upstream.url}/v1"}]},
            {"name": "dear", "deployments": [{"id": "e", "base_url": f"{upstream.url}/v1"}]},
            {
                "name": "claude",
                "deployments": [
                    {
                        "id": "a",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": "sk-ant-upstream",
                    }
                ],
            },
        ],
        "routing": {"retries": 0},
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


def _post(proxy: ProxyInThread, path: str, raw: bytes, key: str = ALICE) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(f"{proxy.url}{path}", content=raw, headers=headers, timeout=10)


def _openai_400(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "duplicate_key"
    return error


def _sent(upstream: ScriptedUpstream) -> int:
    return len(upstream.requests)


def test_a_previous_response_id_given_twice_never_reaches_another_keys_response(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    """Bob names alice's response first and his own last: the proxy checked his own,
    the upstream would read alice's."""
    alices = openai.OpenAI(base_url=proxy.base_url, api_key=ALICE, max_retries=0)
    theirs = alices.responses.create(model="m", input="alice's secret").id
    bobs = openai.OpenAI(base_url=proxy.base_url, api_key=BOB, max_retries=0)
    own = bobs.responses.create(model="m", input="bob's").id
    before = _sent(upstream)
    raw = (
        b'{"model": "m", "input": "go on", "previous_response_id": "%s",'
        b' "previous_response_id": "%s"}' % (theirs.encode(), own.encode())
    )
    error = _openai_400(_post(proxy, "/v1/responses", raw, key=BOB))
    assert error["param"] == "previous_response_id"
    assert "previous_response_id" in error["message"]
    assert _sent(upstream) == before


@pytest.mark.parametrize(
    ("raw", "key", "param"),
    [
        pytest.param(
            b'{"model": "dear", "model": "m", "messages": [{"role": "user", "content": "hi"}]}',
            BOB,
            "model",
            id="model-off-the-allow-list-first",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
            b' "max_tokens": 100000, "max_tokens": 5}',
            BUDGET,
            "max_tokens",
            id="max-tokens-larger-than-reserved-first",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 128, "n": 1}',
            ALICE,
            "n",
            id="n-twice",
        ),
        pytest.param(
            b'{"model": "dear", "mod\\u0065l": "m",'
            b' "messages": [{"role": "user", "content": "x"}]}',
            BOB,
            "model",
            id="model-spelled-with-an-escape",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"},'
            b' {"role": "user", "content": "a", "content": "b"}]}',
            ALICE,
            "messages[1].content",
            id="nested-in-a-message",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
            b' "tools": [{"type": "function", "function": {"name": "f",'
            b' "parameters": {"type": "object", "type": "array"}}}]}',
            ALICE,
            "tools[0].function.parameters.type",
            id="deep-in-a-tool-schema",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
            b' "metadata": {"a": 1, "\\u0061": 2}}',
            ALICE,
            "metadata.a",
            id="escaped-nested",
        ),
    ],
)
def test_a_chat_body_with_a_key_twice_is_a_400_naming_it(
    proxy: ProxyInThread, upstream: ScriptedUpstream, raw: bytes, key: str, param: str
) -> None:
    before = _sent(upstream)
    error = _openai_400(_post(proxy, "/v1/chat/completions", raw, key=key))
    assert error["param"] == param
    assert param in error["message"]
    assert _sent(upstream) == before


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", b'{"model": "m", "prompt": "a", "prompt": "b"}', "prompt"),
        ("/v1/embeddings", b'{"model": "m", "input": "a", "input": ["b", "c"]}', "input"),
        (
            "/v1/responses",
            b'{"model": "m", "input": [{"role": "user", "content": "a", "role": "system"}]}',
            "input[0].role",
        ),
    ],
)
def test_every_openai_endpoint_refuses_a_key_twice_in_its_shape(
    proxy: ProxyInThread, upstream: ScriptedUpstream, path: str, raw: bytes, param: str
) -> None:
    before = _sent(upstream)
    error = _openai_400(_post(proxy, path, raw))
    assert error["param"] == param
    assert _sent(upstream) == before


def test_the_messages_api_refuses_a_key_twice_in_anthropics_shape(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    before = _sent(upstream)
    raw = (
        b'{"model": "claude", "max_tokens": 10, "max_tokens": 100000,'
        b' "messages": [{"role": "user", "content": "hi"}]}'
    )
    response = httpx.post(
        f"{proxy.url}/v1/messages",
        content=raw,
        headers={"x-api-key": ALICE, "content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert _sent(upstream) == before


@pytest.mark.parametrize(
    "raw",
    [
        # A colon inside strings, spelled as is and escaped; spaces after separators.
        b'{"model": "m", "messages": [{"role": "user", "content": "a: b \\u003a c"}]}',
        # Every non-ASCII character escaped (Python's json.dumps default).
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "\u00e9 \U0001f600"}]})
        .decode()
        .replace("\u00e9", "\\u00e9")
        .replace("\U0001f600", "\\ud83d\\ude00")
        .encode(),
        # The same key in sibling objects, and a key equal to a string value.
        b'{"model":"m","messages":[{"role":"user","content":"role"},'
        b'{"role":"assistant","content":"model"}],"metadata":{"model":"m"}}',
        # Keys that differ only past an escape.
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
        b' "metadata": {"\\u0061b": 1, "ab\\"": 2, "a\\\\b": 3}}',
    ],
)
def test_a_body_without_a_key_twice_is_served(proxy: ProxyInThread, raw: bytes) -> None:
    response = _post(proxy, "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text


def test_a_body_nested_deeper_than_orjson_dumps_is_checked_too(
    proxy: ProxyInThread, upstream: ScriptedUpstream
) -> None:
    """600 levels (orjson dumps at most 255): served, and refused with a key twice."""
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":'
    raw = head + b'{"d":[' * 300 + b'{"k":1}' + b"]}" * 300 + b"}"
    assert _post(proxy, "/v1/chat/completions", raw).status_code == 200
    before = _sent(upstream)
    twice = raw.replace(b'{"k":1}', b'{"k":1,"k":2}')
    error = _openai_400(_post(proxy, "/v1/chat/completions", twice))
    path = "metadata" + ".d[0]" * 300 + ".k"  # said by its ends: 256 characters at most
    assert error["param"] == f"{path[:120]}...{path[-120:]}"
    assert _sent(upstream) == before
