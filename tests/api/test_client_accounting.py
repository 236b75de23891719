"""A request's journey, accounted for, through the real proxy: what a key is charged for
a stream it leaves before the usage chunk, a client that leaves before the upstream
answers (its slot, turn and upstream call given back), fallbacks within the key's
allow-list, ``n`` in the estimate, and a body nested too deep to re-serialize rewritten
for its deployment's model."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from support.ports import free_port
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-accounting"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, stream_chunks=40, chunk_delay=0.02)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, key: dict[str, Any], **deployment: Any) -> Any:
    return settings_from(
        {
            "keys": [{"name": "app", "key": KEY, **key}],
            "models": [
                {
                    "name": "m",
                    "deployments": [{"id": "d", "base_url": upstream.base_url, **deployment}],
                }
            ],
            "routing": {"retries": 0},
        }
    )


def _quiet(proxy: ProxyInThread) -> None:
    """Return once no upstream call is in flight and the bookkeeping after it has run."""
    pipeline = proxy.app.state.pipeline  # type: ignore[attr-defined]
    wait_until(lambda: not any(pipeline.dispatcher.in_flight.values()), 5.0, "calls ended")
    proxy.settled()


# --- streams left before their usage ---------------------------------------------------


def test_leaving_streams_before_their_usage_chunk_does_not_bypass_a_token_limit(
    upstream: FakeUpstreamHandle,
) -> None:
    """A key of 2,000 tokens a day; streams of about 510 tokens each (prompt and
    max_tokens 500), each read for two chunks and closed before its usage chunk. Each is
    charged at least its estimate: the fourth is refused, not all ten served."""
    config = _config(upstream, {"limits": [{"tokens": 2000, "per": "1d"}]})
    opened, refused = 0, []
    with ProxyInThread(config) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        for _ in range(10):
            try:
                stream = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=500,
                    stream=True,
                )
            except openai.RateLimitError as error:
                refused.append(error.code)
                continue
            opened += 1
            with stream:
                for _, _chunk in zip(range(2), stream, strict=False):
                    pass
            _quiet(proxy)
        assert upstream.stats()["streams_cut"] == 0 and upstream.stats()["served"] == 0
    assert opened == 3
    assert set(refused) == {"key_tpd"}


@pytest.mark.slow
def test_a_stream_read_to_its_end_is_charged_its_reported_usage(
    upstream: FakeUpstreamHandle,
) -> None:
    config = _config(upstream, {"limits": [{"tokens": 2000, "per": "1d"}]})
    with ProxyInThread(config) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        for _ in range(5):  # 5 x 510 estimated: only real usage is kept
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=500, stream=True
            )
            with stream:
                assert sum(1 for _ in stream) > 0
            _quiet(proxy)
        last = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert last.status_code == 200


# --- a client that leaves before the upstream answers ----------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_client_that_leaves_before_the_upstream_answers_frees_its_slot_at_once(
    upstream: FakeUpstreamHandle, stream: bool
) -> None:
    """The upstream never answers (the deployment would wait 60 s). The client leaves:
    the upstream call is closed at once, and the key's only parallel slot and the
    deployment's in-flight count come back: the client's retry is served (its request
    stays counted in the key's rpm: it was sent)."""
    config = _config(upstream, {"rpm": 100, "max_parallel": 1}, timeout="60s", rpm=600)
    body = orjson.dumps({**CHAT, "stream": stream})
    upstream.control(hang_rate=1.0)
    with ProxyInThread(config) as proxy:
        pipeline = proxy.app.state.pipeline  # type: ignore[attr-defined]
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nAuthorization: Bearer "
                + KEY.encode()
                + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            wait_until(lambda: upstream.stats()["hung"] == 1, 5.0, "the upstream has it")
        wait_until(lambda: upstream.stats()["in_flight"] == 0, 5.0, "upstream call closed")
        _quiet(proxy)
        assert pipeline.dispatcher.in_flight == {"d": 0}
        upstream.control(hang_rate=0.0)
        retry = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert retry.status_code == 200, retry.text
    assert retry.headers["x-ratelimit-remaining-requests"] == "98"


# --- fallbacks and the allow-list --------------------------------------------------------


def test_a_fallback_group_the_key_may_not_use_is_not_tried(
    upstream: FakeUpstreamHandle,
) -> None:
    """Group ``a`` has nothing answering; its fallback ``b`` works. A key allowed only
    ``a`` gets ``a``'s failure, not ``b``'s answer; a key allowed both gets ``b``'s."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config = settings_from(
        {
            "keys": [
                {"name": "only-a", "key": "sk-only-a", "models": ["a"]},
                {"name": "both", "key": "sk-both", "models": ["a", "b"]},
            ],
            "models": [
                {"name": "a", "deployments": [{"id": "dead", "base_url": dead}]},
                {"name": "b", "deployments": [{"id": "b1", "base_url": upstream.base_url}]},
            ],
            "routing": {"retries": 2, "fallbacks": {"a": ["b"]}},
        }
    )
    body = {**CHAT, "model": "a"}
    with ProxyInThread(config) as proxy:
        url = f"{proxy.base_url}/chat/completions"
        direct = httpx.post(
            url, json={**body, "model": "b"}, headers={"authorization": "Bearer sk-only-a"}
        )
        only_a = httpx.post(url, json=body, headers={"authorization": "Bearer sk-only-a"})
        both = httpx.post(url, json=body, headers={"authorization": "Bearer sk-both"})
    assert direct.status_code == 403
    assert only_a.status_code == 502, only_a.text
    assert only_a.json()["error"]["type"] == "api_error"
    assert both.status_code == 200
    assert upstream.stats()["requests"] == 1  # only the key allowed b reached it


# --- what a request is estimated at ----------------------------------------------------


def test_n_choices_count_in_the_estimate_without_max_tokens(
    upstream: FakeUpstreamHandle,
) -> None:
    """server.default_max_tokens (256) for each of the 4 choices: at least 1,024 of the
    key's tokens are held while the request runs (the answer's x-ratelimit headers)."""
    config = _config(upstream, {"limits": [{"tokens": 100_000, "per": "1d"}]})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 4}
    with ProxyInThread(config) as proxy:
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200
    held = 100_000 - int(response.headers["x-ratelimit-remaining-tokens"])
    assert held >= 4 * 256


# --- a body nested too deep to re-serialize ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_deeply_nested_body_is_rewritten_for_its_deployment_model(
    upstream: FakeUpstreamHandle, stream: bool
) -> None:
    """Content nested 300 deep (deeper than orjson dumps); the deployment has its own
    upstream model (and a stream needs usage asked): forwarded with the model rewritten,
    the rest of the body as the client sent it."""
    config = _config(upstream, {"rpm": 100}, model="gpt-4o-mini")
    content = b"[" * 300 + b'"deep"' + b"]" * 300
    body = (
        b'{"model":"m","stream":'
        + (b"true" if stream else b"false")
        + b',"max_tokens":5,"messages":[{"role":"user","content":'
        + content
        + b"}]}"
    )
    with ProxyInThread(config) as proxy:
        response = httpx.post(
            f"{proxy.base_url}/chat/completions",
            content=body,
            headers={**AUTH, "content-type": "application/json"},
        )
    assert response.status_code == 200, response.text
    assert b'"model":"gpt-4o-mini"' in response.content


def test_a_body_that_cannot_be_rewritten_is_a_400_and_gives_its_turn_back(
    upstream: FakeUpstreamHandle,
) -> None:
    """``stream_options`` itself nested too deep to write again (the proxy must add
    ``include_usage`` to it): 400 naming it, and the deployment's one turn a minute goes
    back (the next request is served at once, not refused for capacity)."""
    config = _config(upstream, {"rpm": 100}, rpm=1)
    options = b'{"deep":' + b"[" * 300 + b"1" + b"]" * 300 + b"}"
    body = (
        b'{"model":"m","stream":true,"max_tokens":5,"stream_options":'
        + options
        + b',"messages":[{"role":"user","content":"hi"}]}'
    )
    headers = {**AUTH, "content-type": "application/json"}
    with ProxyInThread(config) as proxy:
        url = f"{proxy.base_url}/chat/completions"
        refused = httpx.post(url, content=body, headers=headers)
        _quiet(proxy)
        served = httpx.post(url, json=CHAT, headers=AUTH)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "stream_options"
    assert served.status_code == 200, served.text
