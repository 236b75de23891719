"""docs/architecture.md's recipe for a limit kind, followed in the test itself.

The kind, ``streams``: the streams a team has open at once. It is not a plain window
(a request's cost in it depends on its stream flag, and its charge is given back when
the stream ends). Registered here (``limit_kinds.registered``), configured as
``{streams: 2, per: 1d}`` on a team of two keys, it is served and limited through the
real proxy, on the memory limiter and on a Redis the test suite starts: two open streams
of the team, whichever key opened them, refuse a third (429 ``team_streams_1d``), a
request that does not stream still goes, and a stream that ends frees its slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation
from support.scripted_upstream import ScriptedUpstream

from proxy.config.limit_kinds import LimitKind, Priced, registered
from proxy.config.settings import ConfigError

STREAMS = LimitKind("streams", lambda request: 1.0 if request.stream else 0.0, held=True)
KEYS = {"ann": "sk-studio-ann", "ben": "sk-studio-ben"}
HI = [{"role": "user", "content": "hi"}]


class HeldStreams:
    """A chat upstream whose streams stay open until the test ends one (``end_one``)."""

    def __init__(self) -> None:
        self._open: list[threading.Event] = []
        self._lock = threading.Lock()

    def end_one(self) -> None:
        with self._lock:
            self._open.pop(0).set()

    async def __call__(self, conversation: Conversation) -> None:
        if orjson.loads(conversation.request.body).get("stream") is not True:
            await conversation.send(_answer())
            return
        done = threading.Event()
        with self._lock:
            self._open.append(done)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        await conversation.send(head + b"transfer-encoding: chunked\r\n\r\n" + _chunk(_delta()))
        await asyncio.to_thread(done.wait, 30)
        await conversation.send(_chunk(_last()) + _chunk(b"[DONE]") + b"0\r\n\r\n")


def _chunk(event: bytes) -> bytes:
    data = b"data: %s\n\n" % event
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
_USAGE = b'{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}'


def _delta() -> bytes:
    return _HEAD + b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}'


def _last() -> bytes:
    return _HEAD + b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":%s}' % _USAGE


def _answer() -> bytes:
    choice = b'{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}'
    body = b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[%s],' % choice
    body += b'"usage":%s}' % _USAGE
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


def _config(upstream_url: str, redis_url: str) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "teams": [{"name": "studio", "limits": [{"streams": 2, "per": "1d"}]}],
        "keys": [{"name": n, "key": k, "team": "studio"} for n, k in KEYS.items()],
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": f"{upstream_url}/v1"}]}],
        "routing": {"retries": 0},
    }


@pytest.fixture(params=["memory", "redis"])
def proxy(request: pytest.FixtureRequest) -> Iterator[tuple[ProxyInThread, HeldStreams]]:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    upstream = HeldStreams()
    with registered(STREAMS), ScriptedUpstream(upstream) as served:
        server = ProxyInThread(settings_from(_config(served.url, redis_url)))
        with server:
            yield server, upstream


def _client(server: ProxyInThread, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEYS[name], max_retries=0)


def _open_stream(server: ProxyInThread, name: str) -> openai.Stream[Any]:
    return _client(server, name).chat.completions.create(model="m", messages=HI, stream=True)


def _refusal(server: ProxyInThread, name: str) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as refused:
        _open_stream(server, name)
    return refused.value


def test_the_recipe_kind_prices_a_request_by_its_stream_flag() -> None:
    assert STREAMS.price(Priced("chat", {}, stream=True)) == 1.0
    assert STREAMS.price(Priced("chat", {}, stream=False)) == 0.0


@pytest.mark.slow
def test_a_team_holds_two_streams_at_once(proxy: tuple[ProxyInThread, HeldStreams]) -> None:
    server, upstream = proxy
    first, second = _open_stream(server, "ann"), _open_stream(server, "ben")
    refused = _refusal(server, "ann")  # the team's two are open, whoever opened them
    assert refused.code == "team_streams_1d"
    assert int(refused.response.headers["retry-after"]) > 0
    # A request that does not stream costs nothing in it.
    answer = _client(server, "ben").chat.completions.create(model="m", messages=HI)
    assert answer.choices[0].message.content == "ok"
    upstream.end_one()
    assert next(c.choices[0].delta.content for c in first if c.choices) == "ok"
    third = _served_once_settled(server, "ben")  # the ended stream's slot is free again
    assert _refusal(server, "ann").code == "team_streams_1d"  # and taken by the third
    for stream in (second, third):
        upstream.end_one()
        assert any(c.usage is not None for c in stream)
    last = _served_once_settled(server, "ann")
    upstream.end_one()
    assert any(c.usage is not None for c in last)


def _served_once_settled(server: ProxyInThread, name: str) -> openai.Stream[Any]:
    """A stream opened once the slot an ended one held is back (its settlement runs
    on the proxy's loop just after the end reached the client: asked again until then)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return _open_stream(server, name)
        except openai.RateLimitError:
            if time.monotonic() > deadline:
                raise
            server.settled()
            time.sleep(0.01)


def test_the_kind_is_config_only_while_registered() -> None:
    config = _config("http://127.0.0.1:1", "")
    with pytest.raises(ConfigError, match="streams"):  # an unknown field
        settings_from(config)
    with registered(STREAMS):
        team = settings_from(config).teams[0]
        assert [r.kind for r in team.limit_rules()] == ["streams"]
        dumped = team.limits[0].model_dump()  # as the admin API lists it: as written
        assert dumped["streams"] == 2 and "registered_kind" not in dumped
        config["models"][0]["deployments"][0]["limits"] = [{"streams": 2, "per": "1d"}]
        with pytest.raises(ConfigError, match="limits keys and teams only"):
            settings_from(config)
