"""The fake upstream speaks OpenAI's Responses API, checked with the official SDK: plain and
streamed creation, the per-instance store behind the id routes and previous_response_id,
the limits and faults it shares with chat, and its stats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.sse import named_events

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.fake_upstream.responses import ResponseStore, Stored

MODEL = "gpt-4o-mini"
KEY = "sk-upstream"


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {"api_key": KEY}


@pytest.fixture
def client(upstream: FakeUpstreamHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.base_url, api_key=KEY, max_retries=0)


@pytest.fixture
def http(upstream: FakeUpstreamHandle) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=upstream.base_url, headers=headers, timeout=5) as session:
        yield session


# ------------------------------------------------------------------ create


def test_a_plain_response_is_a_completed_response_object_with_usage(
    client: openai.OpenAI,
) -> None:
    response = client.responses.create(model=MODEL, input="Hello there, fake!")
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.model == MODEL
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.content[0].type == "output_text"
    assert len(response.output_text.split()) == 16
    usage = response.usage
    assert usage is not None
    # The chat estimate: ceil(18 chars / 4) + 3 per message + 3
    assert usage.input_tokens == 5 + 3 + 3
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens == 16
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + 16


def test_instructions_count_as_one_more_message(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="abcd", instructions="efgh")
    assert response.usage is not None
    assert response.usage.input_tokens == 2 + 3 * 2 + 3


def test_max_output_tokens_caps_the_answer_and_leaves_it_incomplete(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    upstream.control(completion_tokens=40)
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=20)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 20


def test_max_output_tokens_below_16_is_rejected_as_openai_does(http: httpx.Client) -> None:
    answer = http.post("/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 5})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "max_output_tokens"
    assert error["code"] == "integer_below_min_value"


def test_a_stream_is_semantic_events_ending_in_response_completed_without_done(
    http: httpx.Client,
) -> None:
    answer = http.post("/responses", json={"model": MODEL, "input": "hi", "stream": True})
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in answer.text
    events = named_events(answer.text)
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 8,  # stream_chunks
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[0][1]["response"]["status"] == "in_progress"
    assert events[0][1]["response"]["usage"] is None
    deltas = "".join(data["delta"] for name, data in events if name.endswith(".delta"))
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == deltas
    assert final["usage"]["output_tokens"] == 16
    assert final["usage"]["total_tokens"] == final["usage"]["input_tokens"] + 16


def test_the_sdk_streams_and_assembles_the_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Hello") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == text
    assert final.usage is not None and final.usage.output_tokens == 16


def test_a_capped_stream_ends_in_response_incomplete(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    upstream.control(completion_tokens=40)
    stream = client.responses.create(model=MODEL, input="hi", stream=True, max_output_tokens=16)
    types = [event.type for event in stream]
    assert types[-1] == "response.incomplete"


def test_cache_read_tokens_are_reported_as_cached_input(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    upstream.control(cache_read_tokens=4)
    response = client.responses.create(model=MODEL, input="Hello there, fake!")
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 4


# ------------------------------------------------------------------ the store


@pytest.mark.slow
def test_a_created_response_can_be_retrieved_listed_and_deleted(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    created = client.responses.create(model=MODEL, input="Remember me")
    assert client.responses.retrieve(created.id).output_text == created.output_text
    items = client.responses.input_items.list(created.id)
    (item,) = items.data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].type == "input_text" and item.content[0].text == "Remember me"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    assert upstream.stats()["unknown_response_ids"] == 1


def test_delete_answers_a_deleted_object(client: openai.OpenAI, http: httpx.Client) -> None:
    created = client.responses.create(model=MODEL, input="x")
    answer = http.delete(f"/responses/{created.id}")
    assert answer.json() == {"id": created.id, "object": "response.deleted", "deleted": True}


def test_streamed_responses_are_stored_too(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="x") as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).status == "completed"


def test_a_stored_response_is_replayed_as_its_stream_with_stream_true(
    upstream: FakeUpstreamHandle, client: openai.OpenAI, http: httpx.Client
) -> None:
    """``GET /v1/responses/{id}?stream=true`` (``retrieve(id, stream=True)``): the events
    a stream of it sent, ending in ``response.completed``; no tokens generated again."""
    streamed = http.post("/responses", json={"model": MODEL, "input": "hi", "stream": True})
    rid = named_events(streamed.text)[0][1]["response"]["id"]
    served = upstream.stats()["tokens_served"]
    replayed = http.get(f"/responses/{rid}", params={"stream": "true"})
    assert replayed.headers["content-type"].startswith("text/event-stream")
    assert replayed.text == streamed.text
    assert upstream.stats()["tokens_served"] == served
    created = client.responses.create(model=MODEL, input="Remember me")
    events = list(client.responses.retrieve(created.id, stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == created.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == created.output_text


def test_a_replay_starts_after_starting_after(client: openai.OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="x")
    events = list(client.responses.retrieve(created.id, stream=True, starting_after=11))
    assert [e.sequence_number for e in events] == [12, 13, 14, 15]
    assert events[-1].type == "response.completed"


def test_a_failed_responses_replay_ends_in_response_failed(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    upstream.control(error_after_chunks=3)
    rid = next(iter(client.responses.create(model=MODEL, input="x", stream=True))).response.id
    types = [e.type for e in client.responses.retrieve(rid, stream=True)]
    assert types == ["response.created", "response.in_progress", "response.failed"]


def test_a_replay_is_cut_as_any_stream_by_fail_after_chunks(
    upstream: FakeUpstreamHandle, client: openai.OpenAI, http: httpx.Client
) -> None:
    created = client.responses.create(model=MODEL, input="x")
    upstream.control(fail_after_chunks=3)
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(f"/responses/{created.id}", params={"stream": "true"})
    assert upstream.stats()["streams_cut"] == 1


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="x", store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_an_id_this_instance_did_not_create_is_an_openai_shaped_404(
    http: httpx.Client,
) -> None:
    for method, path in [
        ("GET", "/responses/resp_other"),
        ("DELETE", "/responses/resp_other"),
        ("POST", "/responses/resp_other/cancel"),
        ("GET", "/responses/resp_other/input_items"),
    ]:
        answer = http.request(method, path)
        assert answer.status_code == 404, path
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "resp_other" in error["message"]


def test_a_follow_up_counts_the_previous_turn_as_input(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    first = client.responses.create(model=MODEL, input="Hello there, fake!")
    second = client.responses.create(model=MODEL, input="abcd", previous_response_id=first.id)
    assert first.usage is not None and second.usage is not None
    assert second.previous_response_id == first.id
    expected = first.usage.input_tokens + first.usage.output_tokens + (1 + 3 + 3)
    assert second.usage.input_tokens == expected
    assert upstream.stats()["follow_ups"] == 1


def test_a_follow_up_to_another_accounts_response_is_an_error_counted_in_stats(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    config = FakeUpstreamConfig(port=0, chunk_delay=0, api_key=KEY)
    with run_in_thread(config) as other_account:
        other = openai.OpenAI(base_url=other_account.base_url, api_key=KEY, max_retries=0)
        foreign = other.responses.create(model=MODEL, input="elsewhere")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="x", previous_response_id=foreign.id)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"
    stats = upstream.stats()
    assert stats["unknown_response_ids"] == 1
    assert stats["served"] == 0


def test_a_background_response_is_queued_then_done_or_cancelled(
    client: openai.OpenAI,
) -> None:
    queued = client.responses.create(model=MODEL, input="x", background=True)
    assert queued.status == "queued"
    assert client.responses.retrieve(queued.id).status == "completed"
    other = client.responses.create(model=MODEL, input="x", background=True)
    assert client.responses.cancel(other.id).status == "cancelled"
    assert client.responses.retrieve(other.id).status == "cancelled"


def test_only_background_responses_can_be_cancelled(client: openai.OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="x")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(created.id)


# ------------------------------------------------------------------ shared with chat


def test_the_key_is_checked_on_every_route(upstream: FakeUpstreamHandle) -> None:
    wrong = openai.OpenAI(base_url=upstream.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model=MODEL, input="x")
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.retrieve("resp_any")


def test_the_token_window_counts_input_plus_max_output_tokens(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    # input 1 + 3 + 3 = 7 tokens, max_output_tokens 20: 27 a request
    upstream.control(tpm=60)
    body = {"model": MODEL, "input": "abcd", "max_output_tokens": 20}
    assert http.post("/responses", json=body).status_code == 200
    assert http.post("/responses", json=body).status_code == 200
    rejected = http.post("/responses", json=body)
    assert rejected.status_code == 429
    assert rejected.json()["error"]["type"] == "tokens"
    assert int(rejected.headers["retry-after"]) >= 1
    assert upstream.stats()["rejected_by_kind"] == {"tokens": 1}


def test_faults_apply_as_for_chat(upstream: FakeUpstreamHandle, http: httpx.Client) -> None:
    upstream.control(fail_rate=1.0, fail_status=503)
    assert http.post("/responses", json={"model": MODEL, "input": "x"}).status_code == 503
    upstream.control(fail_rate=0.0, fail_after_chunks=3)
    with pytest.raises(httpx.RemoteProtocolError):
        http.post("/responses", json={"model": MODEL, "input": "x", "stream": True})
    assert upstream.stats()["streams_cut"] == 1


def test_stats_count_each_route(upstream: FakeUpstreamHandle, client: openai.OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="x")
    client.responses.retrieve(created.id)
    assert upstream.stats()["by_endpoint"] == {
        "GET /v1/responses/{response_id}": 1,
        "POST /v1/responses": 1,
    }


def test_the_store_drops_the_oldest_response_beyond_its_capacity() -> None:
    store = ResponseStore(capacity=2)
    for rid in ("resp_a", "resp_b", "resp_c"):
        store.put(rid, Stored(b"{}", b"[]", tokens=1))
    assert store.peek("resp_a") is None
    assert store.peek("resp_b") is not None and store.peek("resp_c") is not None


def test_error_after_chunks_ends_the_stream_with_response_failed(
    upstream: FakeUpstreamHandle, http: httpx.Client
) -> None:
    upstream.control(error_after_chunks=5)
    answer = http.post("/responses", json={"model": MODEL, "input": "x", "stream": True})
    events = named_events(answer.text)
    assert len(events) == 6
    name, data = events[-1]
    assert name == "response.failed" and data["sequence_number"] == 5
    assert data["response"]["status"] == "failed"
    assert data["response"]["error"]["code"] == "server_error"
    assert data["response"]["usage"] is None
    stats = upstream.stats()
    assert (stats["streams_errored"], stats["served"]) == (1, 0)


def test_a_failed_stream_is_stored_as_failed(
    upstream: FakeUpstreamHandle, client: openai.OpenAI
) -> None:
    upstream.control(error_after_chunks=3)
    events = list(client.responses.create(model=MODEL, input="x", stream=True))
    assert events[-1].type == "response.failed"
    assert client.responses.retrieve(events[0].response.id).status == "failed"
