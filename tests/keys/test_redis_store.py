"""Run-time keys in a real Redis (the session's redis-server; a cluster too): what one
replica's store writes, another's sees at its next look, reading only what changed; a
replica too far behind the trimmed change log reloads everything; a racing change is
retried from the newer record; a Redis that does not answer is a 503, not a crash."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.redis_server import SENTINEL_MASTER, RedisServer, SentinelGroup

from proxy.config.settings import SentinelConfig
from proxy.errors import ServiceUnavailable
from proxy.keys import redis_backend
from proxy.keys.records import digest_of
from proxy.keys.redis_backend import RedisKeyBackend
from proxy.keys.store import Conflict, RuntimeKeys, runtime_keys_for
from proxy.limiter.factory import sentinel_target


def _keep(spec: dict[str, Any]) -> dict[str, Any]:
    return spec


@pytest.fixture
async def pair(redis_url: str) -> AsyncIterator[tuple[RuntimeKeys, RuntimeKeys]]:
    a = RuntimeKeys(RedisKeyBackend(redis_url), shared=True, poll_interval=3600)
    b = RuntimeKeys(RedisKeyBackend(redis_url), shared=True, poll_interval=3600)
    await a.start()
    await b.start()
    yield a, b
    await a.aclose()
    await b.aclose()


async def test_what_one_store_writes_the_other_sees_at_its_next_look(
    pair: tuple[RuntimeKeys, RuntimeKeys],
) -> None:
    a, b = pair
    _, secret = await a.create("svc", {"rpm": 5}, None)
    assert a.find(digest_of(secret)) is not None
    assert b.find(digest_of(secret)) is None
    await b.refresh()
    found = b.find(digest_of(secret))
    assert found is not None and found[1].windows[0].name == "rpm"

    await b.update("svc", {"rpm": 7}, None, _keep)
    await a.refresh()
    found = a.find(digest_of(secret))
    assert found is not None and found[0].rpm == 7

    await a.revoke("svc")
    await b.refresh()
    assert b.find(digest_of(secret)) is None and len(b) == 0


async def test_a_store_started_later_loads_every_key(redis_url: str) -> None:
    writer = RuntimeKeys(RedisKeyBackend(redis_url), shared=True, poll_interval=3600)
    secrets = [(await writer.create(f"k{i}", {}, None))[1] for i in range(50)]
    late = RuntimeKeys(RedisKeyBackend(redis_url), shared=True, poll_interval=3600)
    await late.start()
    try:
        assert len(late) == 50
        assert all(late.find(digest_of(s)) is not None for s in secrets)
    finally:
        await late.aclose()
        await writer.aclose()


async def test_a_store_behind_the_trimmed_change_log_reloads_everything(
    pair: tuple[RuntimeKeys, RuntimeKeys], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_backend, "_KEEP_CHANGES", 3)
    a, b = pair
    created = [(await a.create(f"k{i}", {}, None))[1] for i in range(6)]
    await a.revoke("k0")
    await b.refresh()
    assert len(b) == 5
    assert b.find(digest_of(created[0])) is None
    assert all(b.find(digest_of(s)) is not None for s in created[1:])


async def test_every_key_a_store_stops_knowing_is_told_once(
    pair: tuple[RuntimeKeys, RuntimeKeys], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revoked here, deleted by another replica, or absent from a full reload: ``on_gone``
    hears its name (the catalog in force forgets what it built for it)."""
    monkeypatch.setattr(redis_backend, "_KEEP_CHANGES", 3)
    a, b = pair
    heard_a: list[str] = []
    heard_b: list[str] = []
    a.on_gone, b.on_gone = heard_a.append, heard_b.append
    for name in ("k0", "k1", "k2"):
        await a.create(name, {}, None)
    await b.refresh()
    await a.revoke("k0")
    await b.refresh()  # one change: read as such
    assert (heard_a, heard_b) == (["k0"], ["k0"])
    await a.revoke("k1")
    for i in range(3, 7):
        await a.create(f"k{i}", {}, None)
    await b.refresh()  # behind the trimmed log: every key again
    assert (heard_a, heard_b) == (["k0", "k1"], ["k0", "k1"])
    await a.update("k2", {"rpm": 1}, None, _keep)
    await b.refresh()  # a change is no departure
    assert heard_b == ["k0", "k1"]


async def test_names_are_unique_across_replicas(pair: tuple[RuntimeKeys, RuntimeKeys]) -> None:
    a, b = pair
    await a.create("svc", {}, None)
    with pytest.raises(Conflict):
        await b.create("svc", {}, None)


async def test_a_rotation_racing_another_change_is_applied_to_the_newer_record(
    pair: tuple[RuntimeKeys, RuntimeKeys],
) -> None:
    a, b = pair
    await a.create("svc", {"rpm": 1}, None)
    await b.refresh()

    def meanwhile(spec: dict[str, Any]) -> dict[str, Any]:
        return spec

    # b changes the record between a's read and a's write: a's write is refused, then
    # redone over b's version.
    original_get = a.backend.get
    raced = False

    async def get_then_race(name: str) -> Any:
        nonlocal raced
        found = await original_get(name)
        if not raced:
            raced = True
            await b.update("svc", {"rpm": 9}, None, meanwhile)
        return found

    a.backend.get = get_then_race  # type: ignore[method-assign]
    _, secret = await a.rotate("svc", grace=0)
    await b.refresh()
    found = b.find(digest_of(secret))
    assert found is not None and found[0].rpm == 9


async def test_a_redis_that_does_not_answer_is_a_503(disposable_redis: RedisServer) -> None:
    store = RuntimeKeys(
        RedisKeyBackend(disposable_redis.url, timeout=0.2), shared=True, poll_interval=3600
    )
    await store.start()
    _, secret = await store.create("svc", {}, None)
    disposable_redis.kill()
    try:
        with pytest.raises(ServiceUnavailable) as refused:
            await store.create("other", {}, None)
        assert refused.value.code == "key_store_unavailable"
        assert store.find(digest_of(secret)) is not None  # what it knew still answers
    finally:
        await store.aclose()


async def test_the_store_works_on_a_redis_cluster(redis_cluster_url: str) -> None:
    a = RuntimeKeys(RedisKeyBackend(redis_cluster_url), shared=True, poll_interval=3600)
    b = RuntimeKeys(RedisKeyBackend(redis_cluster_url), shared=True, poll_interval=3600)
    await a.start()
    await b.start()
    try:
        _, secret = await a.create("svc", {}, None)
        await b.refresh()
        assert b.find(digest_of(secret)) is not None
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.slow
async def test_with_redis_sentinel_the_keys_live_on_the_primary_the_sentinels_name(
    sentinel_group: SentinelGroup,
) -> None:
    """``redis.sentinel`` instead of ``redis.url``: the keys are shared (not one process's,
    nor refused with several workers), through the primary the sentinels name."""
    target = sentinel_target(SentinelConfig(master=SENTINEL_MASTER, nodes=sentinel_group.nodes))
    a = runtime_keys_for("", workers=2, timeout=1.0, sentinel=target)
    b = runtime_keys_for("", workers=2, timeout=1.0, sentinel=target)
    assert a.shared and b.shared and a.refusal is None
    try:
        _, secret = await a.create("svc", {"rpm": 5}, None)
        await b.refresh()
        assert b.find(digest_of(secret)) is not None
        with sentinel_group.primary.client() as primary:
            assert primary.hexists(redis_backend.RECORDS, "svc")
    finally:
        await a.aclose()
        await b.aclose()
