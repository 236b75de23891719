"""Where stored responses live: in this process (bounded, kept the upstream's 30 days)
or in Redis for every replica, with what this process saw in front of it; an id that
cannot be told while Redis is down is neither known nor unknown."""

from __future__ import annotations

import pytest
from support.ports import free_port

from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.redis.acl import COMMANDS
from proxy.limiter.redis.runner import ScriptRunner
from proxy.pipeline.affinity import (
    RETENTION,
    AffinityUnavailable,
    LocalAffinity,
    Owner,
    SharedAffinity,
    affinity_for,
)

ALICE = Owner("dep-a", "gpt-4o", "alice", tokens=120)


def patient(url: str) -> ScriptRunner:
    """A runner that waits out a loaded machine (the defaults give up after 0.25 s)."""
    return ScriptRunner(url, op_timeout=5.0, socket_timeout=2.0, connect_timeout=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_response_is_remembered_for_the_upstream_s_retention() -> None:
    clock = Clock()
    store = LocalAffinity(clock=clock)
    await store.remember("resp_1", ALICE)
    clock.now += RETENTION - 1
    assert await store.owner("resp_1") == ALICE
    clock.now += 2
    assert await store.owner("resp_1") is None
    assert len(store) == 0


async def test_the_process_map_is_bounded_the_oldest_going_first() -> None:
    store = LocalAffinity(capacity=2)
    for rid in ("resp_1", "resp_2", "resp_3"):
        await store.remember(rid, ALICE)
    assert await store.owner("resp_1") is None
    assert await store.owner("resp_3") == ALICE
    await store.forget("resp_3")
    assert await store.owner("resp_3") is None


def test_without_redis_the_store_is_the_process_s() -> None:
    assert isinstance(affinity_for(MemoryLimiter()), LocalAffinity)


def test_the_acl_allows_what_the_shared_store_sends() -> None:
    assert {"get", "set", "del"} <= set(COMMANDS)


async def test_every_replica_finds_what_one_remembered(redis_url: str) -> None:
    one = SharedAffinity(patient(redis_url), lambda: True)
    other = SharedAffinity(patient(redis_url), lambda: True)
    try:
        await one.remember("resp_shared", ALICE)
        assert await other.owner("resp_shared") == ALICE
        assert await other.owner("resp_nobody") is None
        ttl = await one.runner.call(lambda r: r.ttl(one.key("resp_shared")))
        assert RETENTION - 5 <= ttl <= RETENTION
        await other.forget("resp_shared")
        one.local.drop("resp_shared")  # as another replica would not have it
        assert await one.owner("resp_shared") is None
    finally:
        await one.runner.aclose()
        await other.runner.aclose()


async def test_a_record_that_is_not_the_proxy_s_is_no_owner(redis_url: str) -> None:
    store = SharedAffinity(patient(redis_url), lambda: True)
    try:
        await store.runner.call(lambda r: r.set(store.key("resp_odd"), "[1, 2]"))
        assert await store.owner("resp_odd") is None
    finally:
        await store.runner.aclose()


async def test_with_redis_down_only_what_this_process_saw_is_known() -> None:
    down = ScriptRunner(f"redis://127.0.0.1:{free_port()}/0", op_timeout=0.2)
    store = SharedAffinity(down, lambda: True)
    try:
        await store.remember("resp_here", ALICE)  # logged, not raised
        assert await store.owner("resp_here") == ALICE
        with pytest.raises(AffinityUnavailable):
            await store.owner("resp_elsewhere")
        circuit_open = SharedAffinity(down, lambda: False)
        with pytest.raises(AffinityUnavailable):
            await circuit_open.owner("resp_elsewhere")  # Redis not even asked
    finally:
        await down.aclose()
