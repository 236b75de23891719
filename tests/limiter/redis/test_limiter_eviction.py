"""What a Redis's maxmemory-policy means for the limiter (eviction.py), and that it is
read at start-up and again after a reconnect (policy.py), against real redis-servers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from support.redis_server import RedisServer

from proxy.limiter.policy import CircuitState, ResilientLimiter
from proxy.limiter.redis.backend import RedisLimiter
from proxy.limiter.redis.eviction import EvictionWatch, evicting


@pytest.mark.parametrize(
    ("policy", "evicts"),
    [
        ("allkeys-lru", True),
        ("allkeys-lfu", True),
        ("allkeys-random", True),
        ("ALLKEYS-LRU", True),
        ("noeviction", False),
        ("volatile-lru", False),
        ("volatile-ttl", False),
        ("volatile-random", False),
    ],
)
def test_only_allkeys_policies_evict_budgets(policy: str, evicts: bool) -> None:
    assert evicting(policy) is evicts


def test_an_evicting_policy_is_a_warning_and_reported_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports: list[bool] = []
    watch = EvictionWatch(reports.append)
    with caplog.at_level(logging.WARNING):
        watch.observe("allkeys-lru", "redis://r:6379")
        watch.observe("allkeys-lru", "redis://r:6379")
    assert reports == [True, True]
    assert len(caplog.records) == 2
    assert "allkeys-lru" in caplog.text and "noeviction" in caplog.text


def test_a_safe_policy_is_reported_quietly(caplog: pytest.LogCaptureFixture) -> None:
    reports: list[bool] = []
    with caplog.at_level(logging.WARNING):
        EvictionWatch(reports.append).observe("volatile-lru", "redis://r:6379")
    assert reports == [False] and not caplog.records


def test_a_refused_config_get_is_said_once_and_reports_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports: list[bool] = []
    watch = EvictionWatch(reports.append)
    with caplog.at_level(logging.WARNING):
        watch.observe(None, "rediss://managed:6379")
        watch.observe(None, "rediss://managed:6379")
    assert reports == []
    assert len(caplog.records) == 1 and "CONFIG GET is not allowed" in caplog.text


def _resilient(url: str) -> ResilientLimiter:
    shared = RedisLimiter(url, op_timeout=2.0, socket_timeout=1.0, connect_timeout=1.0)
    return ResilientLimiter(
        shared,
        on_error="local",
        replica_id="r1",
        heartbeat_interval=0.05,
        failure_threshold=1,
        reset_after=0.1,
    )


async def test_the_policy_is_read_at_start_and_again_after_a_reconnect(
    tmp_path: Path,
) -> None:
    reports: list[bool] = []
    first = RedisServer(tmp_path / "a").start()
    limiter = _resilient(first.url)
    limiter.on_eviction_policy(reports.append)
    try:
        await limiter.start()
        await _until(lambda: reports == [False], "the first read")
        first.kill()
        await _until(lambda: limiter.circuit is not CircuitState.CLOSED, "the outage")
        # Back on the same address, now configured to evict (as a failover's new
        # primary may be).
        second = RedisServer(tmp_path / "b", first.port, "--maxmemory-policy", "allkeys-lru")
        second.start()
        try:
            await _until(lambda: reports == [False, True], "the read after reconnecting")
        finally:
            await limiter.aclose()
            second.kill()
    finally:
        first.kill()


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(200):  # a generous deadline (10 s), not a timing assertion
        if condition():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"not reached: {what}")
