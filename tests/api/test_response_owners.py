"""A stored response belongs to the key that created it, not to its name: through the
real proxy (keys by the admin API, in memory and in Redis) to a scripted Responses API
upstream on loopback, with the OpenAI SDK. A key revoked and created again under the
same name is a new key: the old one's responses are 404 to it (nothing reaches the
upstream); a rotated key is the same key: its responses stay its own."""

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

ADMIN = {"authorization": "Bearer admin-owners"}
JSON = "content-type: application/json"
NAME = "svc-reuse"


class Responses:
    """A Responses API that keeps what it was asked: a create stores its input under a
    new id; ``GET /v1/responses/{id}`` and ``.../input_items`` read it back."""

    def __init__(self) -> None:
        self.ids = (f"resp_{n:04d}" for n in itertools.count())
        self.inputs: dict[str, str] = {}

    async def __call__(self, conversation: Conversation) -> None:
        request = conversation.request
        method, target = request.request_line.split()[:2]
        path = target.split("?")[0]
        if method == "POST" and path == "/v1/responses":
            rid = next(self.ids)
            self.inputs[rid] = orjson.loads(request.body)["input"]
            await conversation.send(answer(orjson.dumps(self._response(rid)), JSON))
            return
        rid = path.split("/")[3]
        if path.endswith("/input_items"):
            item = {
                "id": f"msg_{rid}",
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": self.inputs[rid]}],
            }
            items = {"object": "list", "data": [item], "first_id": item["id"]}
            body = {**items, "last_id": item["id"], "has_more": False}
            await conversation.send(answer(orjson.dumps(body), JSON))
            return
        await conversation.send(answer(orjson.dumps(self._response(rid)), JSON))

    def _response(self, rid: str) -> dict[str, Any]:
        usage = {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}
        text = {"type": "output_text", "text": f"you said: {self.inputs[rid]}", "annotations": []}
        message = {
            "id": f"out_{rid}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
        return {
            "id": rid,
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": "m",
            "output": [message],
            "usage": usage,
        }


@pytest.fixture(params=["memory", "redis"])
def proxy(request: pytest.FixtureRequest) -> Iterator[tuple[ProxyInThread, ScriptedUpstream]]:
    redis_url = "" if request.param == "memory" else request.getfixturevalue("redis_url")
    with ScriptedUpstream(Responses()) as upstream:
        config = {
            "redis": {"url": redis_url},
            "admin": {"keys": ["admin-owners"]},
            "keys": [{"name": "config-key", "key": "sk-config-owners"}],
            "models": [
                {"name": "m", "deployments": [{"id": "d", "base_url": f"{upstream.url}/v1"}]}
            ],
            "routing": {"retries": 0},
        }
        with ProxyInThread(settings_from(config)) as server:
            yield server, upstream


def _admin(proxy: ProxyInThread, method: str, path: str, status: int, body: Any = None) -> Any:
    """An admin call that must answer ``status``: its JSON (None for a 204)."""
    answer = httpx.request(method, f"{proxy.url}/admin/keys{path}", json=body, headers=ADMIN)
    assert answer.status_code == status, answer.text
    return answer.json() if answer.content else None


def _create_key(proxy: ProxyInThread) -> str:
    secret: str = _admin(proxy, "POST", "", 201, {"name": NAME})["key"]
    return secret


def _sdk(proxy: ProxyInThread, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=secret, max_retries=0)


@pytest.mark.slow
def test_a_key_created_again_under_a_revoked_keys_name_cannot_read_its_responses(
    proxy: tuple[ProxyInThread, ScriptedUpstream],
) -> None:
    server, upstream = proxy
    old = _sdk(server, _create_key(server))
    rid = old.responses.create(model="m", input="the old tenant's secret").id
    assert old.responses.input_items.list(rid).data  # its own: readable
    _admin(server, "DELETE", f"/{NAME}", 204)

    new = _sdk(server, _create_key(server))
    sent = len(upstream.requests)
    with pytest.raises(openai.NotFoundError):
        new.responses.retrieve(rid)
    with pytest.raises(openai.NotFoundError):
        new.responses.input_items.list(rid)
    with pytest.raises(openai.NotFoundError):
        new.responses.delete(rid)
    with pytest.raises(openai.NotFoundError):
        new.responses.create(model="m", input="and then?", previous_response_id=rid)
    assert len(upstream.requests) == sent  # nothing went upstream
    mine = new.responses.create(model="m", input="the new tenant's").id
    assert new.responses.retrieve(mine).id == mine  # its own responses are its own


@pytest.mark.slow
def test_a_rotated_key_keeps_its_responses(
    proxy: tuple[ProxyInThread, ScriptedUpstream],
) -> None:
    server, _ = proxy
    before = _sdk(server, _create_key(server))
    rid = before.responses.create(model="m", input="kept across a rotation").id
    rotated = _admin(server, "POST", f"/{NAME}/rotate", 200, {"grace": "0s"})
    after = _sdk(server, rotated["key"])
    assert after.responses.retrieve(rid).id == rid
    [item] = after.responses.input_items.list(rid).data
    assert item.model_dump()["content"][0]["text"] == "kept across a rotation"
    followed = after.responses.create(model="m", input="go on", previous_response_id=rid)
    assert followed.id != rid


@pytest.mark.slow
def test_a_patched_key_keeps_its_responses(
    proxy: tuple[ProxyInThread, ScriptedUpstream],
) -> None:
    server, _ = proxy
    secret = _create_key(server)
    rid = _sdk(server, secret).responses.create(model="m", input="kept across a patch").id
    _admin(server, "PATCH", f"/{NAME}", 200, {"rpm": 100})
    assert _sdk(server, secret).responses.retrieve(rid).id == rid


@pytest.mark.slow
def test_a_config_keys_responses_are_its_own(
    proxy: tuple[ProxyInThread, ScriptedUpstream],
) -> None:
    server, _ = proxy
    config_key = _sdk(server, "sk-config-owners")
    rid = config_key.responses.create(model="m", input="the config key's").id
    assert config_key.responses.retrieve(rid).id == rid
    with pytest.raises(openai.NotFoundError):
        _sdk(server, _create_key(server)).responses.retrieve(rid)
