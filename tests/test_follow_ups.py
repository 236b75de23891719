"""A stored response's follow-ups through the pipeline, without servers (support/journey.py):
pinned to the deployment that created the response, never retried elsewhere, failing
with that deployment's state named; a reload keeps what the process remembered."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from support.journey import KEY, Journey, Upstream, config, deployment

from proxy.pipeline.follow_ups import StoredRoute
from proxy.pipeline.pipeline import Pipeline
from proxy.request.call import Reply
from proxy.shapes.responses import RESPONSES, STORED_RESPONSES

USAGE = {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}
CREATE = {"model": "m", "input": "hi", "max_output_tokens": 100}


def created(host: str) -> httpx.Response:
    rid = f"resp_{host.split('.')[0]}"
    return httpx.Response(200, json={"id": rid, "status": "completed", "usage": USAGE})


def responses_upstream(failing: set[str] | None = None) -> Upstream:
    """Each host creates ``resp_<host>``; a GET of it answers it (500 from ``failing``)."""

    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.method == "POST" and request.url.path.endswith("/responses"):
            return created(host)
        if failing and host in failing:
            return httpx.Response(500, json={"error": {"message": "down"}})
        return httpx.Response(200, json={"id": request.url.path.rsplit("/", 1)[-1]})

    return Upstream({"a.test": answer, "b.test": answer})


async def follow(pipeline: Pipeline, rid: str, stream: bool = False) -> Reply:
    key = pipeline.keys.authenticate(KEY)
    headers = [("authorization", KEY)]
    route = StoredRoute("GET", rid, f"/{rid}" + ("?stream=true" if stream else ""), stream)
    reply = await pipeline.handle(STORED_RESPONSES, b"", headers, key, route=route)
    await asyncio.sleep(0)  # the answer's bookkeeping (one callback)
    await pipeline.drain()
    return reply


async def create(journey: Journey, body: dict[str, Any] = CREATE) -> str:
    reply = await journey.send(body, RESPONSES)
    assert reply.status == 200, reply.body
    return str(orjson.loads(reply.body)["id"])


async def test_a_follow_up_goes_to_the_deployment_that_created_the_response() -> None:
    upstream = responses_upstream()
    journey = Journey(config([deployment("a"), deployment("b")]), upstream)
    for _ in range(4):
        rid = await create(journey)
        upstream.sent.clear()
        reply = await follow(journey.pipeline, rid)
        assert reply.status == 200
        assert upstream.sent == [f"{rid.removeprefix('resp_')}.test"]


async def test_a_stored_responses_events_stream_from_its_holder_and_cost_nothing() -> None:
    """``GET /{id}?stream=true``: the holder's events as a stream (not read whole), the
    final event's usage not charged again (the key's window holds only the create's)."""
    completed = b'event: response.completed\ndata: {"type":"response.completed","response":'
    replay = completed + orjson.dumps({"id": "resp_a", "usage": USAGE}) + b"}\n\n"

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return created(request.url.host)
        assert request.url.query == b"stream=true"
        events = httpx.ByteStream(replay)  # streamed, not read beforehand
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=events)

    upstream = Upstream({"a.test": answer, "b.test": answer})
    journey = Journey(config([deployment("a"), deployment("b")], key={"tpm": 1000}), upstream)
    rid = await create(journey)
    upstream.sent.clear()
    reply = await follow(journey.pipeline, rid, stream=True)
    assert reply.stream is not None and upstream.sent == [f"{rid.removeprefix('resp_')}.test"]
    assert b"".join([chunk async for chunk in reply.stream]) == replay
    await reply.stream.aclose()
    await journey.pipeline.drain()
    after = await journey.send(CREATE, RESPONSES)
    estimate = int(RESPONSES.estimate(CREATE, 0)["tokens"])
    assert (
        int(after.headers["x-ratelimit-remaining-tokens"])
        == 1000 - USAGE["total_tokens"] - estimate
    )


async def test_a_failing_holder_is_not_replaced_by_another_deployment() -> None:
    upstream = responses_upstream(failing={"a.test", "b.test"})
    journey = Journey(config([deployment("a"), deployment("b")], retries=3), upstream)
    rid = await create(journey)
    upstream.sent.clear()
    reply = await follow(journey.pipeline, rid)
    assert reply.status == 502
    assert set(upstream.sent) == {f"{rid.removeprefix('resp_')}.test"}  # it alone


async def test_a_cooling_holder_is_named_in_the_503() -> None:
    upstream = responses_upstream(failing={"a.test"})
    data = config([deployment("a")], retries=0, cooldown={"allowed_fails": 1, "time": "60s"})
    journey = Journey(data, upstream)
    rid = await create(journey)
    assert (await follow(journey.pipeline, rid)).status == 502  # it fails: it cools
    reply = await follow(journey.pipeline, rid)
    assert reply.status == 503
    error = orjson.loads(reply.body)["error"]
    assert error["code"] == "model_unavailable" and "'a'" in error["message"]


async def test_a_reload_keeps_where_responses_live() -> None:
    upstream = responses_upstream()
    journey = Journey(config([deployment("a")]), upstream)
    rid = await create(journey)
    old = journey.pipeline
    reloaded = Pipeline(
        old.settings, old.limiter, httpx.MockTransport(upstream), journey.metrics, previous=old
    )
    assert reloaded.follow_ups.affinity is old.follow_ups.affinity
    assert (await follow(reloaded, rid)).status == 200


async def test_a_background_response_is_charged_its_estimate() -> None:
    def queued(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "resp_q", "status": "queued", "usage": None})

    journey = Journey(config([deployment("a")], key={"tpm": 100_000}), Upstream({"a.test": queued}))
    body = {**CREATE, "background": True}
    await journey.send(body, RESPONSES)
    reply = await journey.send(body, RESPONSES)
    estimate = int(RESPONSES.estimate(body, 0)["tokens"])
    assert int(reply.headers["x-ratelimit-remaining-tokens"]) == 100_000 - 2 * estimate


async def test_continuing_a_conversation_is_estimated_with_what_it_held_so_far() -> None:
    upstream = responses_upstream()
    journey = Journey(config([deployment("a")], key={"tpm": 100_000}), upstream)
    rid = await create(journey)  # settles to its usage: 12 tokens
    body = {**CREATE, "previous_response_id": rid}
    reply = await journey.send(body, RESPONSES)
    estimate = int(RESPONSES.estimate(body, 0)["tokens"])
    # The upstream reads the 12 tokens of the conversation again, as input: reserved too.
    assert int(reply.headers["x-ratelimit-remaining-tokens"]) == 100_000 - 12 - (estimate + 12)
