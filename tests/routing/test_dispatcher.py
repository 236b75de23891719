"""The dispatcher's journey without servers (support/journey.py): streams and their
usage, a turn dropped once its deployment learned a slower rate, and a turn moments
ahead still waited for, on asyncio's loop and on uvloop's (whose timers end early)."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
import uvloop
from support.journey import REQUEST, Journey, Upstream, config, deployment, ok

from proxy.limiter.base import Sent
from proxy.request.call import Arrival, Ask, Call, Caller
from proxy.routing.dispatcher import SHORT_WAIT, TICK, sleep_until
from proxy.shapes.chat import CHAT

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE_EVENT = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


def sse(*events: bytes) -> httpx.Response:
    stream = httpx.ByteStream(b"".join(events))  # streamed, not read beforehand
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


async def stream_through(journey: Journey) -> tuple[Call, bytes, list[int]]:
    """One streamed request through the dispatcher: the call, what the client read, and
    the statuses the stream ended with."""
    pipeline = journey.pipeline
    body = {**REQUEST, "stream": True}
    cost = CHAT.estimate(body, 256)
    call = Call(
        Arrival("r", CHAT, time.perf_counter()),
        caller=Caller(max_wait=1.0),
        ask=Ask(
            "m",
            body=body,
            raw=orjson.dumps(body),
            stream=True,
            estimate=int(cost["tokens"]),
            cost=cost,
        ),
    )
    ended: list[int] = []

    async def stream_done(status: int) -> None:
        ended.append(status)

    served = await pipeline.dispatcher.run(call, pipeline.catalog.groups["m"], stream_done)
    assert served.reply.stream is not None
    read = b"".join([chunk async for chunk in served.reply.stream])
    await pipeline.drain()
    return call, read, ended


async def test_a_stream_reports_its_usage_and_the_client_sees_no_usage_it_did_not_ask() -> None:
    journey = Journey(
        config([deployment("a")]), Upstream({"a.test": lambda _: sse(CHUNK, USAGE_EVENT, DONE)})
    )
    call, read, ended = await stream_through(journey)
    assert read == CHUNK + DONE  # the usage event the proxy asked for is removed
    assert (call.trip.prompt_tokens, call.trip.completion_tokens, call.trip.charged_tokens()) == (
        7,
        3,
        10,
    )
    assert ended == [200]
    assert journey.counted("llmproxy_usage_unreadable_total") == 0


async def test_a_stream_that_completes_without_usage_is_charged_its_estimate_and_counted() -> None:
    journey = Journey(config([deployment("a")]), Upstream({"a.test": lambda _: sse(CHUNK, DONE)}))
    call, read, ended = await stream_through(journey)
    assert read == CHUNK + DONE
    assert call.trip.charged_tokens() == call.ask.estimate  # never a refund
    assert ended == [200]
    assert (
        journey.counted("llmproxy_usage_unreadable_total", shape="chat/completions", deployment="a")
        == 1
    )


async def test_a_turn_reserved_before_its_deployment_learned_a_slower_rate_is_dropped() -> None:
    """A waits for the upstream; B's turn, a second later, is reserved meanwhile. A's
    answer is a 429 holding the deployment longer than either may wait: once that is
    learned, B's turn is stale and B asks again (held: refused) instead of being sent
    at a pace the upstream just refused."""
    answered = asyncio.Event()
    sent: list[str] = []

    async def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.host)
        await answered.wait()
        return httpx.Response(429, headers={"retry-after": "30"}, json={"error": {}})

    data = config([deployment("a", rpm=60)], retries=0, max_wait="3s", lookahead="0s")
    journey = Journey(data, Upstream({}))
    journey.pipeline.dispatcher.exchange.transport = httpx.MockTransport(upstream)
    first = asyncio.create_task(journey.send())
    while not sent:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(journey.send())
    for _ in range(500):  # B sleeps for its turn on a (not a step of time: a bound)
        if journey.pipeline.dispatcher.tally.waiting_on:
            break
        await asyncio.sleep(0.01)
    assert journey.pipeline.dispatcher.tally.waiting_on == {"a": 1}
    answered.set()
    replies = await asyncio.gather(first, second)
    codes = [orjson.loads(r.body)["error"]["code"] for r in replies]
    assert codes == ["upstream_rate_limited", "model_unavailable"]
    assert sent == ["a.test"]  # B's stale turn never went upstream


async def two_at_once(interval: float) -> tuple[Journey, float, list[float]]:
    """Two requests at once to a deployment paced ``interval`` apart, both answered: the
    journey, when they were sent, and when each reached the upstream."""
    sends: list[float] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sends.append(time.monotonic())
        return ok()(request)

    data = config([deployment("a", rpm=round(60 / interval))], retries=0, lookahead="0s")
    journey = Journey(data, Upstream({}))
    journey.pipeline.dispatcher.exchange.transport = httpx.MockTransport(upstream)
    sent_at = time.monotonic()
    replies = await asyncio.gather(journey.send(), journey.send())
    assert [r.status for r in replies] == [200, 200]
    return journey, sent_at, sends


async def test_a_turn_a_fraction_of_a_millisecond_ahead_is_still_waited_for() -> None:
    """Waits up to SHORT_WAIT are slept plainly (no watchers), but slept, and counted as
    waits: the second of two requests at once sleeps out its turn, one interval after
    the first's, and is sent no sooner."""
    interval = SHORT_WAIT / 2
    journey, sent_at, sends = await two_at_once(interval)
    assert max(sends) - sent_at >= interval
    assert journey.counted("llmproxy_queue_wait_seconds_count") == 1
    assert journey.counted("llmproxy_queue_wait_seconds_sum") >= 0.9 * interval


def test_a_turn_under_a_millisecond_ahead_is_sent_no_sooner_on_uvloop() -> None:
    """On uvloop (the loop the CLI serves on) a plain sleep of under a millisecond ends
    at once: the second of two requests at once, its turn half a millisecond after the
    first's, is still sent no sooner than its turn."""
    interval = 0.0005
    for _ in range(20):
        _, sent_at, sends = uvloop.run(two_at_once(interval))
        assert max(sends) - sent_at >= interval


@pytest.mark.parametrize("seconds", [0.0001, 0.0003, 0.0007, 0.0012, TICK, 0.0031])
def test_a_turns_sleep_never_ends_before_its_time_on_uvloop(seconds: float) -> None:
    async def sleeps() -> None:
        for _ in range(10):
            due = time.monotonic() + seconds
            await sleep_until(due)
            assert time.monotonic() >= due

    uvloop.run(sleeps())


class _TurnAlreadyCome:
    """A turn clock on which every reserved turn has come by the time it is handled (as
    a lease's turns read late under load)."""

    max_correction = 0.05

    def moment(self, clock: object, at: float, wait: float, handled: float) -> float:
        return handled - 0.001


async def test_a_turn_that_came_while_it_was_handled_is_sent_at_once_and_not_counted_a_wait() -> (
    None
):
    journey = Journey(config([deployment("a", rpm=6000)], retries=0, lookahead="0s"), Upstream({}))
    journey.pipeline.dispatcher.turn_clock = _TurnAlreadyCome()  # type: ignore[assignment]
    journey.pipeline.dispatcher.exchange.transport = httpx.MockTransport(ok())
    replies = await asyncio.gather(journey.send(), journey.send())  # the second's turn: later

    assert [r.status for r in replies] == [200, 200]
    assert journey.counted("llmproxy_queue_wait_seconds_count") == 0
    assert journey.pipeline.dispatcher.waiting == 0  # its place in the queue given back


async def test_of_a_large_group_all_are_asked_when_none_of_the_first_can_take_it() -> None:
    """Six deployments, five of them out of requests this minute: whichever three the
    weighted order puts first, every request is served by the sixth."""
    full = [deployment(f"d{i}", rpm=1) for i in range(5)]
    data = config([*full, deployment("free")], retries=0, max_wait="0s")
    script = {f"d{i}.test": ok() for i in range(5)} | {"free.test": ok()}
    journey = Journey(data, Upstream(script))
    small = {f"d{i}.test" for i in range(5)}
    for _ in range(200):  # spend the five small ones (and some of the free one's)
        if small <= set(journey.upstream.sent):
            break
        await journey.send()
    spent = len(journey.upstream.sent)
    for _ in range(20):
        assert (await journey.send()).status == 200
    assert set(journey.upstream.sent[spent:]) == {"free.test"}


async def test_a_turn_later_than_the_pacing_margin_is_not_sent_and_its_request_asks_again() -> None:
    """A request whose loop stalled past its turn by more than the margin (here: its
    turn placed 200 ms in the past) does not send it: sent, it could come too close to
    the turns after it. Its request asks for a new turn and is served; the turn is
    counted and its lateness measured (catalog/pacing.py)."""
    sends: list[float] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sends.append(time.monotonic())
        return ok()(request)

    journey = Journey(config([deployment("a", rpm=600)], retries=0), Upstream({}))
    dispatcher = journey.pipeline.dispatcher
    dispatcher.exchange.transport = httpx.MockTransport(upstream)
    pacing = journey.pipeline.catalog.pacing
    due = dispatcher._due
    stalled = [True]

    def first_one_stalled(
        group: str, sent: Sent, wait: float, handled: float, margin: float
    ) -> float:
        moment = due(group, sent, wait, handled, margin)
        return moment - 0.2 if stalled and stalled.pop() else moment

    dispatcher._due = first_one_stalled  # type: ignore[method-assign]
    reply = await journey.send()

    assert reply.status == 200
    assert len(sends) == 1  # the late turn was not sent; the second one was
    assert pacing.turns_dropped == 1
    assert pacing.lateness.samples == 2  # both measured: the one dropped, the one sent
    assert pacing.lateness.latest < 0.2
