"""A stored response's events (``GET /v1/responses/{id}?stream=true``, the SDK's
``responses.retrieve(id, stream=True)``) through the real proxy, from an upstream that
does as scripted: passed through chunk by chunk, as a streamed create's are, and the
lies an upstream may tell (a stream cut early, a body that is no event stream, a 404)
met as a streamed create meets them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, answer, chunked
from support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths

KEY = "sk-stored-streams"
MODEL = "m"
RID = "resp_0123abcd"
USAGE = {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}
JSON = "content-type: application/json"
SSE = "content-type: text/event-stream"


def _event(kind: str, number: int, **fields: Any) -> bytes:
    payload = {"type": kind, "sequence_number": number, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _response(status: str, usage: dict[str, int] | None) -> dict[str, Any]:
    return {"id": RID, "object": "response", "status": status, "output": [], "usage": usage}


CREATED = _event("response.created", 0, response=_response("in_progress", None))
DELTA = _event("response.output_text.delta", 1, item_id="msg_1", delta="Hello")
COMPLETED = _event("response.completed", 2, response=_response("completed", USAGE))
PLAIN = orjson.dumps(_response("completed", USAGE))


class Script:
    """What the upstream answers a stream request with (``scene``), and a gate the test
    opens once it has read the first event (``go``)."""

    def __init__(self) -> None:
        self.scene = "whole"
        self.go = threading.Event()
        self.released: bool | None = None  # the gate was opened before the upstream gave up
        self.lines: list[str] = []  # the request lines it was sent

    async def __call__(self, conversation: Conversation) -> None:
        request = conversation.request
        self.lines.append(request.request_line)
        if request.body and orjson.loads(request.body).get("stream") is not True:
            await conversation.send(answer(PLAIN, JSON))  # a create: the id to follow up
            return
        scene = self.scene
        if scene == "404":
            error = {"message": f"Response with id '{RID}' not found.", "type": "x"}
            await conversation.send(answer(orjson.dumps({"error": error}), JSON, status="404"))
            return
        if scene == "plain":  # no event stream: the response object, as a GET without it
            await conversation.send(answer(PLAIN, JSON))
            return
        await conversation.send(b"HTTP/1.1 200 OK\r\n" + SSE.encode())
        await conversation.send(b"\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(CREATED))
        if scene == "cut":
            await conversation.send(chunked(DELTA))
            conversation.close()  # no last chunk: the body is incomplete
            return
        if scene == "held":  # nothing more until the client has the first event
            self.released = await asyncio.to_thread(self.go.wait, 10)
        await conversation.send(chunked(DELTA, COMPLETED) + b"0\r\n\r\n")


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def proxy(script: Script, serving_path: str) -> Iterator[ProxyInThread]:
    with ScriptedUpstream(script) as upstream:
        config = {
            "keys": [{"name": "app", "key": KEY, "limits": [{"tokens": 100_000, "per": "1d"}]}],
            "models": [
                {"name": MODEL, "deployments": [{"id": "d", "base_url": upstream.url}]},
            ],
            "routing": {"retries": 0},
        }
        with ProxyInThread(settings_from(config)) as server:
            yield server


@pytest.fixture
def client(proxy: ProxyInThread, script: Script) -> openai.OpenAI:
    script.scene, script.go, script.released = "whole", threading.Event(), None
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    assert sdk.responses.create(model=MODEL, input="hi").id == RID  # the proxy knows it
    return sdk


def _stream(client: openai.OpenAI, how: str) -> Any:
    """The same events asked for either way: a streamed create, or a retrieve."""
    if how == "create":
        return client.responses.create(model=MODEL, input="hi", stream=True)
    return client.responses.retrieve(RID, stream=True)


WAYS = ["create", "retrieve"]


@pytest.mark.parametrize("how", WAYS)
def test_each_event_reaches_the_client_before_the_upstream_sends_the_next(
    client: openai.OpenAI, script: Script, how: str
) -> None:
    script.scene = "held"
    events = iter(_stream(client, how))
    assert next(events).type == "response.created"
    script.go.set()  # only now does the upstream go on
    assert [e.type for e in events] == ["response.output_text.delta", "response.completed"]
    assert script.released is True


def test_a_retrieved_stream_charges_the_key_nothing(
    proxy: ProxyInThread, client: openai.OpenAI
) -> None:
    """Its final event repeats the usage counted when the response was made."""

    def left() -> int:
        proxy.settled()
        raw = client.responses.with_raw_response.retrieve(RID)
        return int(raw.headers["x-ratelimit-remaining-tokens"])

    before = left()
    assert [e.type for e in _stream(client, "retrieve")][-1] == "response.completed"
    assert left() == before


def test_the_upstream_is_asked_for_the_stream_at_its_path(
    proxy: ProxyInThread, client: openai.OpenAI, script: Script
) -> None:
    answer = httpx.get(
        f"{proxy.base_url}/responses/{RID}",
        params={"stream": "true", "starting_after": "0"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["cache-control"] == "no-cache"
    assert answer.text == (CREATED + DELTA + COMPLETED).decode()
    assert script.lines[-1] == f"GET /responses/{RID}?stream=true&starting_after=0 HTTP/1.1"


@pytest.mark.parametrize("how", WAYS)
def test_a_stream_cut_early_ends_in_the_apis_error_event(
    client: openai.OpenAI, script: Script, how: str
) -> None:
    script.scene = "cut"
    seen: list[str] = []
    with pytest.raises(openai.APIError, match="interrupted"):
        seen.extend(e.type for e in _stream(client, how))
    assert seen == ["response.created", "response.output_text.delta"]


@pytest.mark.parametrize("how", WAYS)
def test_a_body_that_is_no_event_stream_is_passed_on_as_it_came(
    proxy: ProxyInThread, client: openai.OpenAI, script: Script, how: str
) -> None:
    """An upstream that ignores ``stream``: its JSON goes to the client whole, as sent."""
    script.scene = "plain"
    auth = {"Authorization": f"Bearer {KEY}"}
    if how == "create":
        body = {"model": MODEL, "input": "hi", "stream": True}
        answer = httpx.post(f"{proxy.base_url}/responses", json=body, headers=auth)
    else:
        answer = httpx.get(f"{proxy.base_url}/responses/{RID}?stream=true", headers=auth)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == PLAIN


def test_an_upstream_404_reaches_the_client_as_the_upstreams(
    client: openai.OpenAI, script: Script
) -> None:
    script.scene = "404"
    with pytest.raises(openai.NotFoundError, match=RID):
        client.responses.retrieve(RID, stream=True)
