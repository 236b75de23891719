"""What is specific to the Redis backend: key layout, expiry, script loading, error
mapping, cluster detection, heartbeats. Real redis-server processes, no mocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from support.limits import RULE, patient, rpm, tpm
from support.redis_server import RedisServer

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    Outcome,
    StorageError,
)
from proxy.limiter.core import health
from proxy.limiter.core.verdicts import IN_FLIGHT_MARGIN, LEASE_TTL
from proxy.limiter.redis import scripts
from proxy.limiter.redis.backend import RedisLimiter

KEY = KeyLimits(
    "team-a",
    windows=(
        rpm(60, 60),
        tpm(6000, 6000),
    ),
    max_parallel=4,
)
DEP = DeploymentLimits(
    "openai-a",
    windows=(
        rpm(60, 1),
        tpm(6000, 1000),
    ),
    probe_timeout=20.0,
)


@pytest.fixture(params=[True, False], ids=["pipelined", "redis-py-pipeline"])
async def limiter(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[RedisLimiter]:
    """Both ways batches travel: the limiter's own connection, redis-py's pipeline."""
    lim = patient(redis_url, pipelined=request.param)
    yield lim
    await lim.aclose()


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


async def test_keys_are_hash_tagged_one_slot_per_key_and_per_group(
    limiter: RedisLimiter, redis_url: str
) -> None:
    await limiter.acquire_key(KeyAsk(KEY, "lease-1", estimate_cost(100)))
    await limiter.reserve(
        GroupAsk("gpt-4o-mini", [DEP], estimate_cost(100), max_wait=5, slot="r1", least_busy=True)
    )
    await limiter.settle(
        DeploymentSettlement(
            "gpt-4o-mini", DEP, slot="", outcome=Outcome("failure", "timeout"), rule=RULE
        )
    )
    with sync_client(redis_url) as c:
        keys = set(c.keys("*"))
    assert keys == {
        "{llmproxy:v2:k:team-a}:rpm",
        "{llmproxy:v2:k:team-a}:tpm",
        "{llmproxy:v2:k:team-a}:leases",
        "{llmproxy:v2:g:gpt-4o-mini}:d:openai-a:rpm",
        "{llmproxy:v2:g:gpt-4o-mini}:d:openai-a:tpm",
        "{llmproxy:v2:g:gpt-4o-mini}:d:openai-a:health",
        "{llmproxy:v2:g:gpt-4o-mini}:d:openai-a:inflight",
    }
    assert len({key_slot(k.encode()) for k in keys if ":k:" in k}) == 1
    assert len({key_slot(k.encode()) for k in keys if ":g:" in k}) == 1


async def test_a_key_in_a_team_keeps_its_windows_in_the_teams_slot(
    limiter: RedisLimiter, redis_url: str
) -> None:
    team = KeyLimits("research", windows=(rpm(60),), max_parallel=4, scope="team")
    key = KeyLimits("alice", windows=(rpm(10), tpm(1000)), team=team)
    assert (await limiter.acquire_key(KeyAsk(key, "lease-1", estimate_cost(100)))).allowed
    with sync_client(redis_url) as c:
        keys = set(c.keys("*"))
    assert keys == {
        "{llmproxy:v2:t:research}:k:alice:rpm",
        "{llmproxy:v2:t:research}:k:alice:tpm",
        "{llmproxy:v2:t:research}:rpm",
        "{llmproxy:v2:t:research}:leases",
    }
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one script, one cluster slot


async def test_idle_keys_expire_a_little_after_they_refill(
    limiter: RedisLimiter, redis_url: str
) -> None:
    await limiter.acquire_key(
        KeyAsk(KEY, "lease-1", estimate_cost(600))
    )  # tpm: 600 tokens take 6 s to refill
    # rpm: 1 s to refill (a rate learned from 429s is a window of its own)
    await limiter.reserve(
        GroupAsk("g", [DEP], estimate_cost(0), max_wait=5, slot="r1", least_busy=True)
    )
    with sync_client(redis_url) as c:
        tpm_ttl = c.pttl("{llmproxy:v2:k:team-a}:tpm")
        rpm_ttl = c.pttl("{llmproxy:v2:g:g}:d:openai-a:rpm")
        leases_ttl = c.pttl("{llmproxy:v2:k:team-a}:leases")
        in_flight_ttl = c.pttl("{llmproxy:v2:g:g}:d:openai-a:inflight")
    assert 6000 + 9000 < tpm_ttl <= 6000 + 10000
    assert 1000 + 9000 < rpm_ttl <= 1000 + 10000
    assert LEASE_TTL * 1000 < leases_ttl <= LEASE_TTL * 1000 + 10000
    deadline = (DEP.probe_timeout + IN_FLIGHT_MARGIN) * 1000
    assert deadline + 9000 < in_flight_ttl <= deadline + 10000


async def test_health_keys_expire_when_nothing_in_them_matters(
    limiter: RedisLimiter, redis_url: str
) -> None:
    key = "{llmproxy:v2:g:g}:d:openai-a:health"
    timeout = Outcome("failure", "timeout")
    await limiter.settle(DeploymentSettlement("g", DEP, slot="", outcome=timeout, rule=RULE))
    with sync_client(redis_url) as c:
        # one failure: it matters for the window (60 s)
        assert 60000 + 9000 < c.pttl(key) <= 61000 + 10000
    cooling = Outcome("failure", "auth", cool_for=5.0)
    await limiter.settle(DeploymentSettlement("g", DEP, slot="", outcome=cooling, rule=RULE))
    with sync_client(redis_url) as c:
        # cooling: forgotten FORGET_AFTER after the cooldown ends
        forget = (5 + health.FORGET_AFTER) * 1000
        assert forget + 9000 < c.pttl(key) <= forget + 10000


async def test_a_success_of_a_healthy_deployment_writes_no_health(
    limiter: RedisLimiter, redis_url: str
) -> None:
    await limiter.settle(
        DeploymentSettlement(
            "g", DEP, slot="r", outcome=Outcome("success"), rule=RULE, cost={"tokens": -10}
        )
    )
    with sync_client(redis_url) as c:
        assert c.keys("*health*") == []


async def test_snapshot_of_no_deployments_needs_no_round_trip() -> None:
    lim = RedisLimiter("redis://127.0.0.1:1", connect_timeout=0.05)
    assert await lim.snapshot("g", []) == {}
    await lim.aclose()


def test_deployment_scripts_carry_the_python_constants() -> None:
    source = scripts.source("reserve_deployment")
    assert f"local DECREASE = {health.DECREASE!r}" in source
    assert f"local IN_FLIGHT_MARGIN = {IN_FLIGHT_MARGIN!r}" in source
    assert "local DECREASE" not in scripts.source("acquire_key")


async def test_scripts_are_reloaded_after_script_flush(
    limiter: RedisLimiter, redis_url: str
) -> None:
    assert (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed
    with sync_client(redis_url) as c:
        c.script_flush()
    assert (
        await limiter.acquire_key(KeyAsk(KEY, "b", estimate_cost(1)))
    ).allowed  # NOSCRIPT, load, retry


async def test_bucket_scripts_run_as_one_function_library_reloaded_when_flushed(
    limiter: RedisLimiter, redis_url: str
) -> None:
    assert (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed  # connects
    assert (
        await limiter.acquire_key(KeyAsk(KEY, "b", estimate_cost(1)))
    ).allowed  # FCALL: loads the library
    name, _ = scripts.library()
    with sync_client(redis_url) as c:
        assert _libraries(c) == [name]
        c.function_flush()
    assert (
        await limiter.acquire_key(KeyAsk(KEY, "c", estimate_cost(1)))
    ).allowed  # not found, load, retry
    with sync_client(redis_url) as c:
        assert _libraries(c) == [name]


def _libraries(client: redis.Redis) -> list[str]:
    return [
        dict(zip(lib[::2], lib[1::2], strict=True))["library_name"]
        for lib in client.function_list()
    ]


async def test_a_redis_without_functions_gets_scripts(tmp_path: Path) -> None:
    # As Redis 6 answers FCALL: unknown command.
    server = RedisServer(tmp_path / "redis", None, "--rename-command", "FCALL", "").start()
    lim = patient(server.url, clock=lambda: 1000.0)
    try:
        for lease in ("a", "b", "c"):
            assert (await lim.acquire_key(KeyAsk(KEY, lease, estimate_cost(1)))).allowed
        verdict = await lim.acquire_key(KeyAsk(KEY, "d", estimate_cost(1)))
        assert (
            verdict.tightest("requests") is not None
            and verdict.tightest("requests").remaining == 56
        )
    finally:
        await lim.aclose()
        server.kill()


async def test_settlements_wait_for_the_next_reservation_and_go_out_first(
    redis_url: str,
) -> None:
    lim = patient(redis_url, linger=3600, clock=lambda: 1000.0)  # no timer sends them alone
    try:
        assert (await lim.acquire_key(KeyAsk(KEY, "a", estimate_cost(100)))).allowed  # connects
        settled = asyncio.ensure_future(lim.settle(KeySettlement(KEY, "a", {"tokens": -100.0})))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not settled.done()  # waiting for company
        verdict = await lim.acquire_key(
            KeyAsk(KEY, "b", estimate_cost(100))
        )  # urgent: takes the release along
        assert settled.done()
        # The refund ran first: only b's 100 tokens are taken from the 6,000.
        assert (
            verdict.tightest("tokens") is not None and verdict.tightest("tokens").remaining == 5900
        )
    finally:
        await lim.aclose()


async def test_script_errors_become_storage_errors(limiter: RedisLimiter, redis_url: str) -> None:
    with sync_client(redis_url) as c:
        c.set("{llmproxy:v2:k:team-a}:rpm", "not a hash")
    with pytest.raises(StorageError, match="WRONGTYPE"):
        await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))


async def test_unreachable_redis_is_a_storage_error_fast(disposable_redis: RedisServer) -> None:
    lim = RedisLimiter(disposable_redis.url)
    assert (await lim.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed
    disposable_redis.kill()
    started = time.monotonic()
    with pytest.raises(StorageError):
        await lim.acquire_key(KeyAsk(KEY, "b", estimate_cost(1)))
    assert time.monotonic() - started < 0.5
    await lim.aclose()


async def test_a_stalled_redis_times_out(disposable_redis: RedisServer) -> None:
    lim = RedisLimiter(disposable_redis.url, op_timeout=0.2, socket_timeout=0.1)
    assert (await lim.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed
    with disposable_redis.client() as c:
        c.execute_command("CLIENT", "PAUSE", "1000", "ALL")  # the server stops answering
    started = time.monotonic()
    with pytest.raises(StorageError):
        await lim.acquire_key(KeyAsk(KEY, "b", estimate_cost(1)))
    assert time.monotonic() - started < 0.5
    await lim.aclose()


async def test_construction_does_not_connect() -> None:
    lim = RedisLimiter("redis://127.0.0.1:1", connect_timeout=0.05)
    assert lim.is_cluster is None
    with pytest.raises(StorageError):
        await lim.reserve(GroupAsk("g", [DEP], estimate_cost(1), max_wait=0))
    await lim.aclose()


async def test_single_redis_is_detected(limiter: RedisLimiter) -> None:
    await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))
    assert limiter.is_cluster is False


async def test_cluster_is_detected_from_a_plain_url(redis_cluster_url: str) -> None:
    lim = patient(redis_cluster_url)
    assert redis_cluster_url.startswith("redis://")
    assert (await lim.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed
    assert lim.is_cluster is True
    assert (
        await lim.reserve(GroupAsk("g", [DEP], estimate_cost(1), max_wait=0))
    ).deployment_id == DEP.id
    await lim.aclose()


async def test_cluster_scheme_skips_detection(redis_cluster_url: str) -> None:
    url = redis_cluster_url.replace("redis://", "redis+cluster://")
    lim = patient(url)
    assert lim.is_cluster is True
    assert (await lim.acquire_key(KeyAsk(KEY, "a", estimate_cost(1)))).allowed
    await lim.aclose()


async def test_keys_spread_over_cluster_slots(redis_cluster_url: str) -> None:
    lim = patient(redis_cluster_url)
    keys = [KeyLimits(f"team-{i}", windows=(rpm(1, 1),)) for i in range(20)]
    verdicts = await asyncio.gather(
        *(lim.acquire_key(KeyAsk(k, "a", estimate_cost(0))) for k in keys)
    )
    assert all(v.allowed for v in verdicts)
    verdicts = await asyncio.gather(
        *(lim.acquire_key(KeyAsk(k, "b", estimate_cost(0))) for k in keys)
    )
    assert not any(v.allowed for v in verdicts)
    await lim.aclose()


async def test_heartbeats_count_live_replicas(limiter: RedisLimiter) -> None:
    assert await limiter.heartbeat("replica-a", alive_for=3.0) == 1
    assert await limiter.heartbeat("replica-b", alive_for=3.0) == 2
    assert await limiter.heartbeat("replica-a", alive_for=3.0) == 2
    await limiter.leave("replica-a")
    assert await limiter.heartbeat("replica-b", alive_for=3.0) == 1


async def test_heartbeats_share_the_pacing_margin_each_live_replica_needs(
    limiter: RedisLimiter,
) -> None:
    """catalog/pacing.py: each heartbeat carries the replica's need and reads back every
    live replica's; a replica that leaves, or goes silent, or shares none, is not read."""
    assert await limiter.heartbeat_paced("a", 3.0, None, 0.0123) == (1, {"a": 0.0123})
    count, margins = await limiter.heartbeat_paced("b", 3.0, None, 0.05)
    assert (count, margins) == (2, {"a": 0.0123, "b": 0.05})
    assert await limiter.heartbeat("c", alive_for=3.0) == 3  # a replica sharing none
    assert (await limiter.heartbeat_paced("a", 3.0, None, None))[1] == {"b": 0.05}
    await limiter.leave("b")
    assert await limiter.heartbeat_paced("a", 3.0, None, 0.002) == (2, {"a": 0.002})
    await limiter.heartbeat_paced("d", 0.05, None, 0.09)
    async with asyncio.timeout(5.0):  # d silent past its window (Redis's clock): not read
        while "d" in (await limiter.heartbeat_paced("a", 0.05, None, 0.002))[1]:
            await asyncio.sleep(0.01)


async def test_silent_replicas_stop_counting(limiter: RedisLimiter) -> None:
    await limiter.heartbeat("replica-a", alive_for=0.05)
    # Redis's own clock decides who is alive: ask until replica-a has gone silent long
    # enough (bounded), rather than sleeping a guess.
    async with asyncio.timeout(5.0):
        while await limiter.heartbeat("replica-b", alive_for=0.05) != 1:
            await asyncio.sleep(0.01)
