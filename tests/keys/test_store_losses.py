"""Run-time key stores on a real Redis that loses its data, or never answers: a store
that lost its data (FLUSHALL, a rollback of its version) is detected once, counted and
filled again from what the replicas knew, the newest of each name winning in whatever
order they write back; a store never read opens nothing; a write sent twice runs once;
a revoke of a revoked key says so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.ports import free_port
from support.redis_server import TlsRedisServer

from proxy.config.settings import ClientKey
from proxy.errors import AuthenticationFailed, ServiceUnavailable
from proxy.keys import redis_backend
from proxy.keys.audit import result_of
from proxy.keys.memory_backend import MemoryKeyBackend
from proxy.keys.records import digest_of
from proxy.keys.redis_backend import RECORDS, VERSION, RedisKeyBackend
from proxy.keys.store import KeyRevoked, OutcomeUnknown, RuntimeKeys
from proxy.pipeline.auth import KeyStore


def _keep(spec: dict[str, Any]) -> dict[str, Any]:
    return spec


def _store(url: str) -> RuntimeKeys:
    return RuntimeKeys(RedisKeyBackend(url), shared=True, poll_interval=3600)


@pytest.fixture
async def pair(redis_url: str) -> AsyncIterator[tuple[RuntimeKeys, RuntimeKeys]]:
    a, b = _store(redis_url), _store(redis_url)
    await a.start()
    await b.start()
    yield a, b
    await a.aclose()
    await b.aclose()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_a_flushed_store_is_detected_counted_once_and_filled_again(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis
) -> None:
    a, b = pair
    lost: list[str] = []
    a.on_lost = lambda: lost.append("a")
    b.on_lost = lambda: lost.append("b")
    _, secret = await a.create("svc", {"rpm": 5}, None)
    await b.refresh()
    await redis.flushall()

    await a.refresh()
    await a.refresh()  # the same loss is not counted twice
    assert lost == ["a"] and a.losses == 1
    assert a.last_loss is not None and a.last_loss["reason"] == "wiped"
    assert a.last_loss["outcome"] == "restored" and a.last_loss["written_back"] == 1
    assert await redis.hexists(RECORDS, "svc")
    await b.refresh()  # b sees another epoch: its own loss, nothing newer to write
    assert lost == ["a", "b"] and b.status()["losses_detected"] == 1
    assert b.status()["state"] == "current"

    # The key still works everywhere, and is still revocable everywhere.
    assert a.find(digest_of(secret)) is not None and b.find(digest_of(secret)) is not None
    await b.revoke("svc")
    await a.refresh()
    assert a.find(digest_of(secret)) is None


async def test_a_revoke_just_after_a_loss_finds_the_key_and_revokes_it_everywhere(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis
) -> None:
    """Before any look saw the loss: the write names the epoch it read, is refused, the
    store is recovered (the key written back), and the revoke done."""
    a, b = pair
    _, secret = await a.create("svc", {}, None)
    await b.refresh()
    await redis.flushall()
    await b.revoke("svc")
    assert b.losses == 1 and b.find(digest_of(secret)) is None
    await a.refresh()
    assert a.find(digest_of(secret)) is None and not await redis.hexists(RECORDS, "svc")


async def test_a_store_started_after_the_loss_gets_the_keys_written_back(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis, redis_url: str
) -> None:
    a, _ = pair
    _, secret = await a.create("svc", {}, None)
    await redis.flushall()
    late = _store(redis_url)
    await late.start()  # reads an empty store (and gives it an epoch) before a's look
    try:
        assert late.find(digest_of(secret)) is None and late.known
        await a.refresh()  # a: another epoch, a loss: writes its copy into it
        await late.refresh()  # late: the same epoch, and a change to read
        assert late.find(digest_of(secret)) is not None and late.losses == 0
    finally:
        await late.aclose()


@pytest.mark.parametrize("first", ["a", "b"])
async def test_copies_merge_newest_first_in_any_order(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis, first: str
) -> None:
    """b missed a's last changes (a revoke, a rotation) when the store lost its data:
    whichever writes back first, the revoke and the rotation win over b's older copy."""
    a, b = pair
    _, gone = await a.create("gone", {}, None)
    await a.create("rotated", {}, None)
    await b.refresh()
    await a.revoke("gone")
    _, new = await a.rotate("rotated", grace=0)
    await redis.flushall()

    order = (a, b) if first == "a" else (b, a)
    for store in order:
        await store.refresh()
    for store in (a, b):
        await store.refresh()
        assert store.find(digest_of(gone)) is None
        found = store.find(digest_of(new))
        assert found is not None and found[0].name == "rotated"
    assert not await redis.hexists(RECORDS, "gone")


async def test_a_version_gone_back_is_a_loss_and_the_missing_changes_come_back(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis
) -> None:
    """A failover to a replica that lagged: same epoch, an older version, the last
    create missing."""
    a, b = pair
    await a.create("k1", {}, None)
    _, secret = await a.create("k2", {}, None)
    await b.refresh()
    await redis.hdel(RECORDS, "k2")
    await redis.set(VERSION, 1)
    await b.refresh()
    assert b.losses == 1 and b.last_loss is not None
    assert b.last_loss["reason"] == "rolled_back"
    assert await redis.hexists(RECORDS, "k2")
    await a.refresh()
    assert a.find(digest_of(secret)) is not None


async def test_a_store_that_held_nothing_is_reset_quietly(
    pair: tuple[RuntimeKeys, RuntimeKeys], redis: aioredis.Redis
) -> None:
    a, _ = pair
    await redis.flushall()
    await a.refresh()
    assert a.losses == 0 and a.status()["state"] == "current"


async def test_a_store_never_read_opens_nothing_and_answers_503() -> None:
    nowhere = RuntimeKeys(
        RedisKeyBackend(f"redis://127.0.0.1:{free_port()}", timeout=0.2),
        shared=True,
        poll_interval=3600,
    )
    await nowhere.start()
    try:
        assert nowhere.state() == "unread" and not nowhere.known
        assert nowhere.needed(key_api=True, configured=False)
        store = KeyStore([], nowhere)
        assert not store.open_access
        for presented in (None, "Bearer sk-anything"):
            with pytest.raises(ServiceUnavailable) as refused:
                store.authenticate(presented)
            assert refused.value.code == "key_store_unavailable"
        # Beside the file's keys: those work, a missing key is a 401, others a 503.
        configured = KeyStore([ClientKey(name="cfg", key="sk-cfg")], nowhere)
        assert configured.authenticate("Bearer sk-cfg") is not None
        with pytest.raises(AuthenticationFailed):
            configured.authenticate(None)
        with pytest.raises(ServiceUnavailable):
            configured.authenticate("Bearer sk-other")
        with pytest.raises(ServiceUnavailable):
            await nowhere.create("svc", {}, None)
    finally:
        await nowhere.aclose()


async def test_open_access_needs_an_empty_store_and_no_key_api_or_the_files_word() -> None:
    keys = RuntimeKeys(MemoryKeyBackend(), shared=False)
    assert KeyStore([], keys).open_access  # no key API: dev, as ever
    closed = KeyStore([], keys, open_when_empty=False)  # the key API holds the keys
    assert not closed.open_access
    with pytest.raises(AuthenticationFailed):
        closed.authenticate(None)
    refused = RuntimeKeys(MemoryKeyBackend(), shared=False, refusal="several workers")
    assert KeyStore([], refused, open_when_empty=False).open_access  # it holds none, ever


async def test_a_write_sent_twice_under_one_id_runs_once(redis: aioredis.Redis) -> None:
    write = redis.register_script(redis_backend._WRITE)
    await redis.set(redis_backend.EPOCH, "e1")
    args: list[Any] = ["create", "svc", b'{"x":1}', b"", 100, "e1", 1.0, "op-1", 100]
    first = await write(keys=redis_backend._WRITE_KEYS, args=args)
    again = await write(keys=redis_backend._WRITE_KEYS, args=args)
    assert first == again == [1]  # not "exists": the same answer, the same version
    assert int(await redis.get(VERSION)) == 1
    other = await write(keys=redis_backend._WRITE_KEYS, args=[*args[:7], "op-2", 100])
    assert other == [-1]


async def test_a_revoke_of_a_revoked_key_says_when(pair: tuple[RuntimeKeys, RuntimeKeys]) -> None:
    a, b = pair
    await a.create("svc", {}, None)
    await a.revoke("svc")
    with pytest.raises(KeyRevoked) as again:
        await b.revoke("svc")
    assert again.value.status == 404 and again.value.code == "key_revoked"
    assert "was revoked at" in again.value.message


def test_an_unknown_outcome_is_audited_as_such() -> None:
    assert result_of(OutcomeUnknown("the outcome is unknown")) == "unknown"
    assert result_of(ServiceUnavailable("x", code="key_store_unavailable")) == "unavailable"


async def test_the_acl_user_may_run_all_the_store_does(
    tls_redis: TlsRedisServer, tls_redis_url: str
) -> None:
    """As the ACL user of docs/production.md (``proxy.limiter.redis.acl``), over TLS:
    read, write, revoke, and a loss written back."""
    a, b = _store(tls_redis_url), _store(tls_redis_url)
    await a.start()
    await b.start()
    try:
        assert a.state() == b.state() == "current"
        _, secret = await a.create("svc", {}, None)
        await a.create("gone", {}, None)
        await a.revoke("gone")
        await b.refresh()
        tls_redis.flush()
        await a.refresh()
        await b.refresh()
        assert a.losses == b.losses == 1 and a.state() == b.state() == "current"
        assert b.find(digest_of(secret)) is not None
        with pytest.raises(KeyRevoked):
            await b.revoke("gone")
    finally:
        await a.aclose()
        await b.aclose()
