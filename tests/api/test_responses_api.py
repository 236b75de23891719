"""OpenAI's Responses API through the proxy, as a user sees it: the official OpenAI SDK
against a real proxy (memory limiter) in front of the real fake upstream, over HTTP on
127.0.0.1. Created responses are limited and accounted like chat; their follow-ups
reach the account that holds them, for the key that created them only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.shapes.responses import RESPONSES

UPSTREAM_KEY = "sk-upstream-responses"
ALICE = "sk-alice-responses"
BOB = "sk-bob-responses"
TPM = 100_000
DEFAULT_MAX_TOKENS = 64
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    config: dict[str, Any] = {
        "keys": [
            # A day's window: what refills during a test is under a token.
            {"name": "alice", "key": ALICE, "limits": [{"tokens": TPM, "per": "1d"}]},
            {"name": "bob", "key": BOB},
        ],
        "models": [
            {
                "name": MODEL,
                "deployments": [
                    {
                        "id": "fake-a",
                        "base_url": upstream.base_url,
                        "api_key": UPSTREAM_KEY,
                        "model": "upstream-mini",
                    }
                ],
            }
        ],
        "routing": {"retries": 0},
        "server": {"default_max_tokens": DEFAULT_MAX_TOKENS},
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(upstream: FakeUpstreamHandle) -> None:
    upstream.reset()
    upstream.control(completion_tokens=16, cache_read_tokens=0)


def sdk(proxy: ProxyInThread, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)


def estimate(**body: Any) -> int:
    return int(RESPONSES.estimate(body, DEFAULT_MAX_TOKENS)["tokens"])


class Probe:
    """A small request's view of the key's tokens: what was left once its estimate was
    reserved (``left``), that estimate, and what it really used."""

    def __init__(self, proxy: ProxyInThread) -> None:
        body = {"model": MODEL, "input": "?", "max_output_tokens": 16}
        raw = sdk(proxy).responses.with_raw_response.create(**body)
        usage = raw.parse().usage
        assert usage is not None
        self.left = int(raw.headers["x-ratelimit-remaining-tokens"])
        self.estimate = estimate(**body)
        self.used = usage.total_tokens
        proxy.settled()

    def then(self, used: int) -> int:
        """What the next probe sees if ``used`` tokens were charged in between."""
        return self.left + self.estimate - self.used - used - self.estimate


# ------------------------------------------------------------------ create


def test_a_plain_response_passes_through_and_the_key_is_charged_its_real_usage(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    before = Probe(proxy)
    body = {"model": MODEL, "input": "Hello there, fake!", "max_output_tokens": 2000}
    raw = sdk(proxy).responses.with_raw_response.create(**body)
    response = raw.parse()
    assert response.status == "completed"
    assert len(response.output_text.split()) == 16
    assert response.usage is not None and response.usage.output_tokens == 16
    used = response.usage.total_tokens
    assert upstream.stats()["last_request"]["model"] == "upstream-mini"
    # Charged the estimate (2000 output tokens and the input) while in flight:
    in_flight = int(raw.headers["x-ratelimit-remaining-tokens"])
    assert in_flight <= before.left + before.estimate - before.used - estimate(**body)
    proxy.settled()
    # ... then its real usage: far less. (A token may refill meanwhile.)
    assert 0 <= Probe(proxy).left - before.then(used) <= 2


@pytest.mark.slow
def test_a_stream_passes_every_event_through_and_settles_to_the_final_usage(
    proxy: ProxyInThread,
) -> None:
    before = Probe(proxy)
    stream = sdk(proxy).responses.create(
        model=MODEL, input="Stream me", stream=True, max_output_tokens=3000
    )
    events = list(stream)
    types = [event.type for event in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert types.count("response.output_text.delta") == 8
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.output_text == deltas
    assert final.usage is not None
    proxy.settled()
    assert 0 <= Probe(proxy).left - before.then(final.usage.total_tokens) <= 2


@pytest.mark.slow
def test_the_sdk_stream_helper_assembles_the_response(proxy: ProxyInThread) -> None:
    with sdk(proxy).responses.stream(model=MODEL, input="Hello") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_text == text and final.status == "completed"


@pytest.mark.parametrize(
    ("field", "bad"),
    [("input", 42), ("max_output_tokens", "many"), ("tools", {}), ("stream", "yes")],
)
def test_a_field_the_proxy_reads_in_the_wrong_shape_is_a_400_naming_it(
    proxy: ProxyInThread, field: str, bad: object
) -> None:
    answer = httpx.post(
        f"{proxy.base_url}/responses",
        json={"model": MODEL, "input": "x", field: bad},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == field


def test_the_model_is_required(proxy: ProxyInThread) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(proxy).responses.create(input="no model")  # type: ignore[call-overload]
    assert raised.value.param == "model"  # type: ignore[attr-defined]


# ------------------------------------------------------------------ follow-ups


def test_retrieve_input_items_and_delete_reach_the_response(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    client = sdk(proxy)
    created = client.responses.create(model=MODEL, input="Remember me")
    assert client.responses.retrieve(created.id).output_text == created.output_text
    (item,) = client.responses.input_items.list(created.id).data
    assert item.content[0].text == "Remember me"  # type: ignore[union-attr]
    deleted = client.with_raw_response.responses.delete(created.id)
    assert deleted.http_response.status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)  # forgotten: the proxy's own 404
    assert upstream.stats()["unknown_response_ids"] == 0


def test_a_streamed_response_is_followed_up_too(proxy: ProxyInThread) -> None:
    client = sdk(proxy)
    with client.responses.stream(model=MODEL, input="x") as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).status == "completed"
    follow = client.responses.create(model=MODEL, input="and?", previous_response_id=final.id)
    assert follow.previous_response_id == final.id


@pytest.mark.slow
def test_a_response_retrieved_as_a_stream_replays_its_events_and_costs_nothing(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    """``retrieve(id, stream=True)`` (a background response's events): passed through as
    a streamed create's are, to the account that holds it; the usage its final event
    repeats was counted when it was made."""
    client = sdk(proxy)
    created = client.responses.create(model=MODEL, input="Replay me", background=True)
    before = Probe(proxy)
    events = list(client.responses.retrieve(created.id, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert deltas == events[-1].response.output_text  # type: ignore[union-attr]
    assert upstream.stats()["by_endpoint"]["GET /v1/responses/{response_id}"] == 1
    proxy.settled()
    assert 0 <= Probe(proxy).left - before.then(0) <= 2


def test_a_background_response_can_be_cancelled(proxy: ProxyInThread) -> None:
    client = sdk(proxy)
    queued = client.responses.create(model=MODEL, input="later", background=True)
    assert queued.status == "queued"
    assert client.responses.cancel(queued.id).status == "cancelled"


def test_another_key_and_an_unknown_id_get_the_same_404(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    created = sdk(proxy).responses.create(model=MODEL, input="mine")
    bob = sdk(proxy, BOB)
    answers = []
    for rid in (created.id, "resp_unknown0123"):
        with pytest.raises(openai.NotFoundError) as raised:
            bob.responses.retrieve(rid)
        answers.append(raised.value.body)
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(rid, stream=True)
        with pytest.raises(openai.NotFoundError):
            bob.responses.input_items.list(rid)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(rid)
        with pytest.raises(openai.NotFoundError):
            bob.responses.create(model=MODEL, input="theirs?", previous_response_id=rid)
    assert [a["code"] for a in answers] == ["not_found", "not_found"]  # type: ignore[index]
    assert sdk(proxy).responses.retrieve(created.id).id == created.id  # still alice's
    assert upstream.stats()["unknown_response_ids"] == 0  # nothing went upstream


def test_a_malformed_id_never_reaches_the_upstream(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    answer = httpx.get(
        f"{proxy.base_url}/responses/resp..%5cx", headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert answer.status_code == 404
    assert upstream.stats()["by_endpoint"] == {}


def test_the_id_routes_need_a_key(proxy: ProxyInThread) -> None:
    answer = httpx.get(f"{proxy.base_url}/responses/resp_x")
    assert answer.status_code == 401
    assert answer.headers["x-request-id"]
