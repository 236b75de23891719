"""Exact under real conditions: limits learned when the config is wrong, token limits
paced as upstreams enforce them, cooldowns waited out. Two proxy replicas share a real
Redis in front of a strict fake upstream; load is open-loop, bounded in time.

The figures each run measures are printed (``-s`` shows them); docs/benchmarks.md ("Limiter
accuracy") records them. The assertions are the issue's targets, not timings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from support.load import LoadResult, drive
from support.models import RATE, WINDOW, strict_model, strict_upstream_config
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.catalog.catalog import pacing_headroom
from proxy.catalog.pacing import INITIAL_MARGIN, RESERVE
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

TRUE_RATE = RATE  # the strict upstream's
# 15 s of load, as in test_pacing_margin.py's learned limit: the first 429 comes within
# 5 s (demand twice the limit) and the pace is learned from it, so at least two thirds of
# the run is spent at the learned pace; and the upstream's 10 s window slides past the
# first window's burst into the learned pace before the load ends.
DURATION = 15.0
# What the proxy paces a deployment stating its true limit to: less the pacing margin
# (auto: measured, starting at INITIAL_MARGIN and narrowing from there).
PACED = 1.0 - pacing_headroom(INITIAL_MARGIN + RESERVE)


def _config(redis_url: str, upstream: FakeUpstreamHandle, **deployment: Any) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "models": strict_model(upstream.base_url, **deployment),
        "routing": {"max_wait": "5s", "retries": 0},
    }


@pytest.fixture
def strict_upstream() -> Iterator[FakeUpstreamHandle]:
    """A strict upstream that tells nothing but its 429s and their retry-after."""
    with run_in_thread(strict_upstream_config(ratelimit_headers=False)) as handle:
        yield handle


def _run(
    tmp_path: Path, upstream: FakeUpstreamHandle, rate: float, duration: float, **deployment: Any
) -> tuple[LoadResult, dict[str, Any]]:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = _config(redis.url, upstream, **deployment)
        proxies = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        upstream.reset()
        result = asyncio.run(drive([p.base_url for p in proxies], rate, duration))
        return result, upstream.stats()


def _report(name: str, result: LoadResult, stats: dict[str, Any]) -> None:
    """What a run measured: the share of the true limit used over the span the upstream
    admitted requests (the queue drains past the load's end), the upstream's 429s."""
    served, rejected, span = stats["served"], stats["rejected"], stats["admitted_span"]
    print(
        f"\n{name}: served {served}, {served / (TRUE_RATE * span):.1%} of the true limit"
        f" over {span:.1f} s; upstream 429s {rejected} ({rejected / max(served, 1):.1%} of"
        f" served); clients: {dict(result.statuses)} {dict(result.codes)}"
    )


@pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it
def test_an_unstated_limit_is_learned_from_429s_alone(
    tmp_path: Path, strict_upstream: FakeUpstreamHandle
) -> None:
    """Demand at twice the upstream's real limit, which the config does not state:
    upstream 429s stay within 5% of what it served, and at least 80% of its real limit is
    used over 15 s. A client gets a 503 only when no turn came within its max_wait after
    a hold, and then with when the earliest does. (A limit overstated twofold is learned
    by the same rule: tests/e2e/test_pacing_margin.py, three replicas, a 1 s window.)"""
    result, stats = _run(tmp_path, strict_upstream, 2 * TRUE_RATE, DURATION)
    _report("learning, no limit", result, stats)
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert set(result.statuses) <= {200, 429, 503}, (result.statuses, result.codes)
    assert all(o.retry_after for o in result.outcomes if o.status in (429, 503))
    assert stats["rejected"] <= 0.05 * stats["served"], stats
    assert stats["served"] >= 0.8 * TRUE_RATE * DURATION, stats


# The token scenarios' request: the proxy estimates 8 + 20 = 28 tokens, the upstream
# counts 7 + 20 = 27 at admission (prompt plus max_tokens, as OpenAI does).
TOKEN_BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 20,
}
ADMITTED = 27
# 12 s of load: twice the upstream's 6 s quantum (its limit pro rata over any 6 s), so
# that window slides past the first turns under full demand; the figure is a rate over
# the span the upstream admitted requests (measured: 92.4-93.5% against the 90.3% asserted).
TOKEN_DURATION = 12.0


@pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it
@pytest.mark.parametrize(
    ("upstream_limits", "tokens_per_second"),
    [
        # 28,000 a minute, enforced pro rata over any 6 s as well (2,800 per 6 s).
        pytest.param({"tpm": 28000, "window": 60.0, "quantum": 6.0}, 28000 / 60, id="quantized"),
    ],
)
def test_tokens_are_paced_as_the_upstream_enforces_them(
    tmp_path: Path, upstream_limits: dict[str, Any], tokens_per_second: float
) -> None:
    """The deployment states its real per-minute token limit; demand is twice it. No
    upstream 429 at all, and at least 95% of the pace the proxy keeps (below the limit by
    the pacing margin) is used. (A strict 10 s token window, on two replicas sharing
    Redis: tests/e2e/test_anthropic_pacing.py, Anthropic's input tokens.)"""
    config = FakeUpstreamConfig(port=0, latency=0.02, **upstream_limits)
    with run_in_thread(config) as upstream, ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        tpm = round(tokens_per_second * 60)
        proxy_config = _config(redis.url, upstream, tpm=tpm)
        proxies = start_together(
            stack, [ProxyProcess(proxy_config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        upstream.reset()
        rate = 2 * tokens_per_second / ADMITTED
        urls = [p.base_url for p in proxies]
        result = asyncio.run(drive(urls, rate, TOKEN_DURATION, body=TOKEN_BODY))
        stats = upstream.stats()
    # Over the span the upstream admitted requests (the queue drains past the load's end).
    pace = stats["admitted_tokens"] / (tokens_per_second * stats["admitted_span"])
    print(
        f"\ntokens, {upstream_limits}: {pace:.1%} of the steady pace over"
        f" {stats['admitted_span']:.1f} s; upstream 429s {stats['rejected']};"
        f" clients: {dict(result.statuses)} {dict(result.codes)}"
    )
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert stats["rejected"] == 0, stats
    assert pace >= 0.95 * PACED, stats  # of what the proxy paces to: >= 89.6% of the limit


# -- waiting out a hold ------------------------------------------------------------------


@pytest.mark.parametrize(("max_wait", "waited_out"), [("10s", True), ("1s", False)])
def test_requests_wait_out_a_held_deployment_within_their_max_wait(
    max_wait: str, waited_out: bool
) -> None:
    """The only deployment answers 429 "retry in ~4 s": the request that got it, and
    requests arriving meanwhile, wait for it when that is within their max_wait, else get
    503 with a retry-after."""
    from support.proxy_server import ProxyInThread, settings_from

    config = FakeUpstreamConfig(port=0, rpm=3, window=4.0, ratelimit_headers=False)
    with run_in_thread(config) as upstream:
        settings = settings_from(
            {
                "models": [
                    {
                        "name": "gpt-4o-mini",
                        "deployments": [{"id": "held", "base_url": upstream.base_url}],
                    }
                ],
                "routing": {"max_wait": max_wait, "retries": 0},
            }
        )
        with ProxyInThread(settings) as proxy:
            url = proxy.base_url

            async def scenario() -> tuple[LoadResult, LoadResult]:
                first = await drive([url], 20.0, 0.2)  # 4 at once: the 4th gets the 429
                during = await drive([url], 10.0, 0.3)  # 3 more during the hold
                return first, during

            first, during = asyncio.run(scenario())
    print(f"\nhold, max_wait {max_wait}: {dict(first.statuses)} then {dict(during.statuses)}")
    if waited_out:  # the 4th waited out the hold its 429 started, then went again
        assert set(first.statuses) == {200}, (first.statuses, first.codes)
        assert set(during.statuses) == {200}, (during.statuses, during.codes)
    else:
        assert first.count(200) == 3 and first.codes["upstream_rate_limited"] == 1
        limited = next(o for o in first.outcomes if o.status == 503)
        assert int(limited.retry_after or 0) >= 1
        assert set(during.codes) == {"model_unavailable"}, during.codes
        assert all(o.status == 503 and int(o.retry_after or 0) >= 1 for o in during.outcomes)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_concurrent_requests_that_meet_an_upstream_429_wait_for_their_turn(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """No configured limit; 12 requests at once from the OpenAI SDK, an upstream that
    takes 9 a second and answers the others 429 with a retry-after of about 1 s, max_wait
    5 s: a turn comes within max_wait (after the hold, at the pace learned), so every
    request waits for it and succeeds; nothing is answered 503."""
    from support.proxy_server import ProxyInThread, settings_from

    config = FakeUpstreamConfig(port=0, rpm=9, window=1.0, ratelimit_headers=False)
    with run_in_thread(config) as upstream:
        redis = {"url": request.getfixturevalue("redis_url")} if backend == "redis" else {}
        settings = settings_from(
            {
                "redis": redis,
                "models": [
                    {
                        "name": "gpt-4o-mini",
                        "deployments": [{"id": "unstated", "base_url": upstream.base_url}],
                    }
                ],
                "routing": {"max_wait": "5s", "retries": 0},
            }
        )
        with ProxyInThread(settings) as proxy:
            client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)

            async def one() -> int:
                try:
                    await client.chat.completions.create(**TOKEN_BODY)
                except openai.APIStatusError as refused:
                    return refused.status_code
                return 200

            async def burst() -> list[int]:
                async with client:
                    return list(await asyncio.gather(*(one() for _ in range(12))))

            statuses = asyncio.run(burst())
        stats = upstream.stats()
    print(f"\n12 at once, {backend}: {statuses}; upstream {stats['by_status']}")
    assert statuses == [200] * 12, statuses
    assert stats["by_status"]["429"] >= 1, stats  # the upstream did refuse some


# -- Redis outages under overload -------------------------------------------------------


def _outage_config(redis_url: str, upstream: FakeUpstreamHandle) -> dict[str, Any]:
    config = _config(redis_url, upstream, rpm=int(TRUE_RATE * 60))
    config["redis"]["on_error"] = "local"
    return config


@pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it
@pytest.mark.parametrize(
    ("outage", "window", "schedule"),
    [
        # Seconds: the outage's start, its length, the load's length. The outage is a whole
        # 10 s window (the breaker opens at once, the fallback fills its own windows) and
        # the load goes on for a whole window after it: the upstream's window slides over
        # both switches and past them. (Measured: 91.8% against the 85.6% asserted.)
        pytest.param("killed", WINDOW, (4.0, 10.0, 24.0), id="killed-10.0"),
        pytest.param("frozen", WINDOW, (4.0, 10.0, 24.0), id="frozen-10.0"),
        # The same limit over a sliding second (the upstream): 1% of it is only
        # 10 ms of slack; the pacing margin covers turns 50 ms late (test_late_replicas).
        # Ten windows in the fallback, twelve after it. (Shorter runs met an upstream 429
        # on a busy host: 10 ms of slack leaves no room for a late turn at a switch.)
        pytest.param("killed", 1.0, (8.0, 10.0, 30.0), id="killed-1.0"),
    ],
)
def test_a_redis_outage_under_overload_overshoots_nothing(
    tmp_path: Path, outage: str, window: float, schedule: tuple[float, float, float]
) -> None:
    """Two replicas at twice a strict upstream's limit; Redis dies (or hangs) 4 s in
    and comes back 10 s later, the load going on 10 s more (with a 1 s window: 8 s in,
    back 10 s later, 12 s more). Zero upstream 429s; clients get only 200 or 429 with a
    retry-after; at least 90% of the pace kept below the limit (the pacing margin) is
    used over the whole run."""
    start, length, duration = schedule
    upstream = FakeUpstreamConfig(
        port=0, rpm=int(TRUE_RATE * window), window=window, latency=0.02, ratelimit_headers=False
    )
    with ExitStack() as stack:
        strict_upstream = stack.enter_context(run_in_thread(upstream))
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = _outage_config(redis.url, strict_upstream)
        proxies = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        strict_upstream.reset()
        urls = [p.base_url for p in proxies]

        async def scenario() -> LoadResult:
            load = asyncio.create_task(drive(urls, 2 * TRUE_RATE, duration))
            await asyncio.sleep(start)  # the outage's start: part of the scenario
            await asyncio.to_thread(redis.kill if outage == "killed" else redis.freeze)
            await asyncio.sleep(length)
            await asyncio.to_thread(redis.start if outage == "killed" else redis.thaw)
            return await load

        result = asyncio.run(scenario())
        stats = strict_upstream.stats()
        logs = [p.logs() for p in proxies]
    _report(f"redis {outage}, {window:g} s window", result, stats)
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert stats["rejected"] == 0, stats
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes)
    assert all(o.retry_after for o in result.outcomes if o.status == 429)
    assert stats["served"] >= 0.9 * PACED * TRUE_RATE * stats["admitted_span"], stats
    for log in logs:  # one outage, one fallback: the breaker stayed open throughout
        assert log.count("rate limiter mode: fallback") == 1, log
        assert log.count("rate limiter mode: shared") == 1, log
