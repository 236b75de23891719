"""Accuracy across replicas: three proxy processes share one Redis in front of a fake
upstream that enforces a strict sliding-window limit. Driven at three times that limit,
the upstream must reject nothing, serve at least 95% of its limit, and every client
request must end in a success or a proxy 429 with retry-after. (Redis killed under load
with ``on_error: local``, each replica keeping to its share: tests/e2e/test_learning.py's
outage scenarios, at a strict upstream.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from support.load import LoadResult, drive
from support.models import LIMIT, RATE, STRICT_RPM, strict_model, strict_upstream_config
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisClusterServers, RedisServer, redis_available
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
    pytest.mark.slow,  # bounded load for many seconds: `make test-fast` skips it
]

# 12 s of load at three times the limit: more than the upstream's 10 s window, so the
# window slides past the first turns while every replica still presses on it.
DURATION = 12.0


def _config(
    redis_url: str, upstream: FakeUpstreamHandle, on_error: str = "local"
) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url, "on_error": on_error},
        "models": strict_model(upstream.base_url, rpm=STRICT_RPM),
        "routing": {"max_wait": "2s", "retries": 0},
    }


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(strict_upstream_config()) as handle:
        yield handle


def _replicas(
    stack: ExitStack, config: dict[str, Any], workdir: Path, n: int = 3
) -> list[ProxyProcess]:
    return start_together(
        stack, [ProxyProcess(config, workdir, name=f"replica-{i}") for i in range(n)]
    )


def _assert_accurate(result: LoadResult, upstream: FakeUpstreamHandle, duration: float) -> None:
    stats = upstream.stats()
    # Counted over the span the upstream admitted requests (the queue drains past the
    # load's end: over the load's own seconds, a short run would count its drain as use).
    span = stats["admitted_span"]
    print(
        f"\nserved {stats['served']} ({stats['served'] / (RATE * span):.1%} of the limit"
        f" over the {span:.1f} s admitted, {duration:.0f} s of load),"
        f" peak window {stats['peak_window_requests']}/{LIMIT},"
        f" upstream 429s {stats['rejected']}; clients: {dict(result.statuses)}"
    )
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes, stats)
    for outcome in result.outcomes:
        if outcome.status == 429:
            assert outcome.retry_after is not None and int(outcome.retry_after) >= 1
            assert outcome.code in ("model_capacity", "queue_full")
    assert stats["rejected"] == 0, stats
    assert stats["peak_window_requests"] <= LIMIT
    assert stats["served"] >= 0.95 * RATE * span, stats
    assert result.count(200) == stats["served"]


def test_three_replicas_share_one_redis_budget(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        proxies = _replicas(stack, _config(redis.url, upstream), tmp_path)
        upstream.reset()
        result = asyncio.run(drive([p.base_url for p in proxies], 3 * RATE, DURATION))
    _assert_accurate(result, upstream, DURATION)


def test_three_replicas_share_a_redis_cluster_budget(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    with ExitStack() as stack:
        cluster = RedisClusterServers(tmp_path / "cluster", masters=3).start()
        stack.callback(cluster.stop)
        proxies = _replicas(stack, _config(cluster.url, upstream), tmp_path)
        upstream.reset()
        result = asyncio.run(drive([p.base_url for p in proxies], 3 * RATE, DURATION))
    _assert_accurate(result, upstream, DURATION)


def test_redis_killed_mid_run_with_reject_answers_503_then_recovers(tmp_path: Path) -> None:
    with ExitStack() as stack:
        upstream = stack.enter_context(run_in_thread(FakeUpstreamConfig(port=0)))
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        proxies = _replicas(stack, _config(redis.url, upstream, on_error="reject"), tmp_path, n=2)
        urls = [p.base_url for p in proxies]

        async def scenario() -> tuple[LoadResult, LoadResult, LoadResult]:
            before = await drive(urls, 10, 2.0)
            await asyncio.to_thread(redis.kill)
            during = await drive(urls, 10, 2.0)
            await asyncio.to_thread(redis.start)
            for p in proxies:  # each probes Redis and shares budgets again
                await asyncio.to_thread(wait_until, lambda p=p: _shared(p), 10.0, "shared")
            after = await drive(urls, 10, 2.0)
            return before, during, after

        before, during, after = asyncio.run(scenario())
    assert set(before.statuses) == {200}
    assert during.statuses[503] >= len(during.outcomes) * 0.8
    assert set(during.statuses) <= {200, 503}
    assert set(after.statuses) == {200}


def _shared(proxy: ProxyProcess) -> bool:
    import httpx

    state = httpx.get(f"{proxy.url}/health/ready", timeout=2).json()
    return bool(state.get("limiter") == "shared")
