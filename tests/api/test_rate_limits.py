"""Limits as a client sees them, through a real proxy (in-memory limiter) and the real
fake upstream: key limits answer 429 at once, deployment limits make requests wait."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-limited"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0.001)) as handle:
        yield handle


def _proxy(
    upstream: FakeUpstreamHandle,
    key: dict[str, Any],
    deployment: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
) -> ProxyInThread:
    config = {
        "keys": [{"name": "limited", "key": KEY, **key}],
        "models": [
            {
                "name": "m",
                "deployments": [{"id": "d1", "base_url": upstream.base_url, **(deployment or {})}],
            }
        ],
        "routing": {"retries": 0, **(routing or {})},
    }
    return ProxyInThread(settings_from(config))


async def _burst(url: str, n: int, body: dict[str, Any] | None = None) -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(f"{url}/chat/completions", json=body or CHAT, headers=headers)
                for _ in range(n)
            )
        )


def _assert_429(response: httpx.Response, code: str) -> None:
    assert response.status_code == 429
    assert response.json()["error"]["code"] == code
    assert int(response.headers["retry-after"]) >= 1
    assert int(response.headers["retry-after-ms"]) >= 1
    assert response.headers["x-request-id"]


@pytest.mark.slow
def test_200_concurrent_requests_against_a_key_of_50_let_exactly_50_through(
    upstream: FakeUpstreamHandle,
) -> None:
    # 50 a day: nothing refills while the burst lasts, however slow the machine (50 a
    # minute would refill one every 1.2 s, and a slow burst could rightly pass a 51st).
    with _proxy(upstream, {"rpd": 50}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 200))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 50
    assert statuses.count(429) == 150
    for response in responses:
        if response.status_code == 429:
            _assert_429(response, "key_rpd")
    assert upstream.stats()["served"] == 50


def test_responses_carry_the_keys_rate_limit_headers(upstream: FakeUpstreamHandle) -> None:
    with _proxy(upstream, {"rpm": 10, "tpm": 10_000}) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        first = client.chat.completions.with_raw_response.create(**CHAT)
        second = client.chat.completions.with_raw_response.create(**CHAT)
    for response in (first, second):
        assert response.headers["x-ratelimit-limit-requests"] == "10"
        assert response.headers["x-ratelimit-limit-tokens"] == "10000"
        assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        assert response.headers["x-ratelimit-reset-tokens"].endswith("s")
    assert int(first.headers["x-ratelimit-remaining-requests"]) == 9
    assert int(second.headers["x-ratelimit-remaining-requests"]) == 8
    assert int(second.headers["x-ratelimit-remaining-tokens"]) < 10_000


def test_a_keys_own_429_carries_its_rate_limit_headers(upstream: FakeUpstreamHandle) -> None:
    """What OpenAI does: the refusal says the limit, that nothing remains, and when."""
    with _proxy(upstream, {"rpm": 1}) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        client.chat.completions.create(**CHAT)
        refused = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {KEY}"},
        )
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-limit-requests"] == "1"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_token_limit_answers_429_key_tpm(upstream: FakeUpstreamHandle) -> None:
    # The whole burst is checked while the first is in flight: its estimate (60 tokens of
    # 100) is not yet settled down to its real usage, which would make room for another.
    upstream.control(latency=1.0)
    with _proxy(upstream, {"tpm": 100}) as proxy:
        body = {**CHAT, "max_tokens": 60}
        responses = asyncio.run(_burst(proxy.base_url, 3, body))
    assert sorted(r.status_code for r in responses) == [200, 429, 429]
    _assert_429(next(r for r in responses if r.status_code == 429), "key_tpm")


def test_a_request_bigger_than_the_key_can_ever_hold_is_a_clear_400(
    upstream: FakeUpstreamHandle,
) -> None:
    with _proxy(upstream, {"tpm": 100}) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**{**CHAT, "max_tokens": 5000})
    assert info.value.code == "request_too_large"


@pytest.mark.slow
def test_max_parallel_caps_in_flight_requests_and_frees_slots(upstream: FakeUpstreamHandle) -> None:
    upstream.control(latency=1.0)  # the whole burst arrives while the first 3 are in flight
    with _proxy(upstream, {"max_parallel": 3}) as proxy:
        limiter = proxy.app.state.pipeline.limiter
        first = asyncio.run(_burst(proxy.base_url, 10))
        # Slots are released once each answer is out, in the background.
        wait_until(lambda: limiter.leases_held("limited") == 0, what="slots released")
        second = asyncio.run(_burst(proxy.base_url, 3))
        wait_until(lambda: limiter.leases_held("limited") == 0, what="slots released again")
    assert sorted(r.status_code for r in first) == [200] * 3 + [429] * 7
    _assert_429(next(r for r in first if r.status_code == 429), "key_parallel")
    assert [r.status_code for r in second] == [200] * 3


@pytest.mark.slow
def test_a_burst_over_the_deployment_limit_waits_for_its_turn(upstream: FakeUpstreamHandle) -> None:
    # The upstream accepts 10 requests in any 5 s, strictly; the proxy paces 12 to that.
    upstream.control(rpm=10, window=5.0)
    with _proxy(upstream, {}, {"rpm": 120}, {"max_wait": "10s"}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 12))
    assert [r.status_code for r in responses] == [200] * 12
    stats = upstream.stats()
    assert stats["rejected"] == 0
    assert stats["served"] == 12


@pytest.mark.slow
def test_beyond_max_wait_the_model_is_at_capacity(upstream: FakeUpstreamHandle) -> None:
    with _proxy(upstream, {}, {"rpm": 60}, {"max_wait": "1.5s"}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 5))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 2  # one now, one a second later
    rejected = [r for r in responses if r.status_code == 429]
    for response in rejected:
        _assert_429(response, "model_capacity")
        # Its turn would come no sooner than ~2 s from now, minus the wait it may take.
        assert float(response.headers["retry-after-ms"]) / 1000 <= 5
    assert len(rejected) == 3


@pytest.mark.slow
def test_a_full_queue_answers_queue_full(upstream: FakeUpstreamHandle) -> None:
    with _proxy(upstream, {}, {"rpm": 60}, {"max_wait": "30s", "max_queue": 2}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 6))
        leftovers = proxy.app.state.pipeline.waiting
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 3  # one at once, two after waiting in the queue
    assert statuses.count(429) == 3
    _assert_429(next(r for r in responses if r.status_code == 429), "queue_full")
    assert leftovers == 0


def test_a_day_window_and_a_30_day_token_budget_name_themselves(
    upstream: FakeUpstreamHandle,
) -> None:
    """Limits as data: a window's 429 says which window, its limit and when it frees;
    the x-ratelimit-* headers show, of each kind, the window with the least left."""
    key = {"rpm": 100, "rpd": 3, "limits": [{"tokens": 100, "per": "30d"}]}
    with _proxy(upstream, key) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
        small = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        first = client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
            **{**small, "max_tokens": 60}
        )
        # The day's window (2 left) is tighter than the minute's (99 left).
        assert first.headers["x-ratelimit-limit-requests"] == "3"
        assert first.headers["x-ratelimit-remaining-requests"] == "2"
        assert first.headers["x-ratelimit-limit-tokens"] == "100"
        with pytest.raises(openai.RateLimitError) as too_many_tokens:
            # About 98 tokens: more than is left, whether or not the first request's
            # estimate was corrected to its real usage yet.
            client.chat.completions.create(**{**small, "max_tokens": 90})  # type: ignore[call-overload]
        error = too_many_tokens.value.body
        assert isinstance(error, dict) and error["code"] == "key_tokens_30d"
        assert "tokens per 30d" in error["message"] and "100" in error["message"]
        for _ in range(2):  # the day's 2nd and 3rd
            client.chat.completions.create(**small)  # type: ignore[call-overload]
        with pytest.raises(openai.RateLimitError) as too_many_requests:
            client.chat.completions.create(**small)  # type: ignore[call-overload]
        error = too_many_requests.value.body
        assert isinstance(error, dict) and error["code"] == "key_rpd"
        assert "requests per day" in error["message"]
        assert int(too_many_requests.value.response.headers["retry-after"]) > 3600


def test_a_keys_own_max_wait_bounds_its_waits(upstream: FakeUpstreamHandle) -> None:
    # The model could make requests wait two minutes; this key waits for nothing.
    with _proxy(upstream, {"max_wait": "0s"}, {"rpm": 60}, {"max_wait": "120s"}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 3))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 429, 429]
    _assert_429(next(r for r in responses if r.status_code == 429), "model_capacity")


@pytest.mark.slow
def test_with_fair_share_on_a_burst_is_deferred_then_served_without_an_upstream_429(
    upstream: FakeUpstreamHandle,
) -> None:
    # 12 requests, 10 a second, a lookahead of 0.3 s: most are deferred (nothing
    # committed), ask again when told, and are all served at the upstream's pace.
    upstream.control(rpm=11, window=1.0)  # 10 a second, and one at the window edge
    routing = {"max_wait": "10s", "lookahead": "300ms"}
    with _proxy(upstream, {}, {"rpm": 600}, routing) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 12))
    assert [r.status_code for r in responses] == [200] * 12
    stats = upstream.stats()
    assert (stats["served"], stats["rejected"]) == (12, 0)


@pytest.mark.slow
def test_requests_waiting_in_their_keys_line_keep_their_own_max_wait(
    upstream: FakeUpstreamHandle,
) -> None:
    # One a second, turns committed half a second ahead (the default lookahead): the
    # burst's later requests are deferred and wait in the key's line; the one whose turn
    # (at 1 s) fits its 1.5 s max_wait is served, those whose turns come later get 429
    # model_capacity with a retry-after, nothing reaching the upstream for them.
    with _proxy(upstream, {"max_wait": "1500ms"}, {"rpm": 60}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 5))
    assert sorted(r.status_code for r in responses) == [200, 200, 429, 429, 429]
    for response in responses:
        if response.status_code == 429:
            _assert_429(response, "model_capacity")
    assert upstream.stats()["served"] == 2
