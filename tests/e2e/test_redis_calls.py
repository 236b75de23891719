"""What one request costs the shared limiter, watched with Redis's MONITOR on a real Redis:
a plain success runs the key check, the reservation and the key's settlement, and
nothing for the deployment, whose state a success does not change; far from their
limits, the key and the deployment run nothing per request (leases)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from support.proxy_server import ProxyInThread, settings_from

from proxy.costs import estimate_cost
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.keys import redis_backend
from proxy.limiter.base import KeyAsk, KeyLimits, KeySettlement, Rate, Window, window_name
from proxy.limiter.redis import scripts
from proxy.limiter.redis.backend import RedisLimiter

KEY = "sk-calls"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
STOP = "test-monitor-stop"
# Run on timers, not per request: replica heartbeats and the state observer's reads.
# key_store_changes: the admin API keys' poll; record_spend: the spend report, once a second.
PERIODIC = ("heartbeat", "snapshot", "key_store_changes", "record_spend")


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


class ScriptMonitor:
    """Counts the limiter scripts and functions Redis runs (by name) while it is open."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.names = {
            hashlib.sha1(scripts.source(n).encode(), usedforsecurity=False).hexdigest(): n
            for n in scripts.BUCKET_SCRIPTS + scripts.PLAIN_SCRIPTS
        } | {scripts.function_name(n): n for n in scripts.BUCKET_SCRIPTS}
        changes = hashlib.sha1(redis_backend._CHANGES.encode(), usedforsecurity=False)
        self.names[changes.hexdigest()] = "key_store_changes"
        self.ran: list[str] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        client = redis.Redis.from_url(self.url)
        with client.monitor() as monitor:
            self._ready.set()
            for command in monitor.listen():
                words = command["command"].split()
                if words[:2] == ["ECHO", STOP]:
                    break
                if words and words[0] in ("EVALSHA", "FCALL"):
                    self.ran.append(self.names.get(words[1], words[1]))
        client.close()

    def __enter__(self) -> ScriptMonitor:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        redis.Redis.from_url(self.url).echo(STOP)
        self._thread.join(5)


def test_a_plain_success_runs_no_deployment_settlement(
    upstream: FakeUpstreamHandle, redis_url: str
) -> None:
    config = {
        "redis": {"url": redis_url},
        # A key too small to lease from (fewer than 64 requests a minute; see below).
        "keys": [{"name": "k", "key": KEY, "rpm": 60, "tpm": 1_000_000}],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url, "rpm": 600}]}
        ],
    }
    with ProxyInThread(settings_from(config)) as proxy:
        headers = {"authorization": f"Bearer {KEY}"}
        httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)  # connects
        _wait_for_settlements(proxy)
        with ScriptMonitor(redis_url) as monitor:
            for _ in range(5):
                reply = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
                assert reply.status_code == 200
            _wait_for_settlements(proxy)
    ran = [name for name in monitor.ran if name not in PERIODIC]
    assert sorted(ran) == sorted(["acquire_key", "reserve_deployment", "settle_key"] * 5)


def test_far_from_their_limits_a_key_and_a_deployment_run_nothing_per_request(
    upstream: FakeUpstreamHandle, redis_url: str
) -> None:
    deployment = {"id": "d", "base_url": upstream.base_url, "rpm": 1_000_000, "burst": 100_000}
    config = {
        "redis": {"url": redis_url},
        "keys": [{"name": "k", "key": KEY, "rpm": 100_000, "tpm": 100_000_000}],
        "models": [{"name": "m", "deployments": [deployment]}],
    }
    with ProxyInThread(settings_from(config)) as proxy:
        headers = {"authorization": f"Bearer {KEY}"}
        with ScriptMonitor(redis_url) as monitor:
            for _ in range(5):
                reply = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers)
                assert reply.status_code == 200
                assert reply.headers["x-ratelimit-limit-requests"] == "100000"
            _wait_for_settlements(proxy)
    ran = [name for name in monitor.ran if name not in PERIODIC]
    # A lease each (renewed, and the old one given back, should the machine be so slow
    # that a quarter of a second passes); none per request. Each is taken by the second
    # request, once the requests come close together (leases.WARM_USES): the first asks,
    # and settles, alone.
    assert {"lease_deployment", "lease_key"} <= set(ran)
    assert ran.count("acquire_key") == ran.count("settle_key") >= 1
    assert ran.count("reserve_deployment") >= 1
    alone = {"acquire_key", "settle_key", "reserve_deployment", "settle_deployment"}
    assert set(ran) <= {"lease_deployment", "lease_key", "return_lease", *alone}


def test_concurrent_settlements_of_one_key_run_as_one_settle_key_call(redis_url: str) -> None:
    # Under load a batch carries several requests' settlements: those of one key are one
    # call. Another key's, and those releasing a parallel slot, stay calls of their own.
    key = KeyLimits("k", windows=(tpm_window(1000),))
    other = KeyLimits("o", windows=(tpm_window(1000),))
    slotted = KeyLimits("p", windows=(tpm_window(1000),), max_parallel=4)

    async def settle_together() -> tuple[list[str], list[object]]:
        limiter = RedisLimiter(redis_url, op_timeout=5.0, socket_timeout=2.0, linger=3600)
        try:
            # Connects and loads the functions; leases "a" and "b" of p.
            for limits in (key, other, slotted):
                await limiter.acquire_key(KeyAsk(limits, "a", estimate_cost(100)))
            await limiter.acquire_key(KeyAsk(slotted, "b", estimate_cost(100)))
            settlements = [
                KeySettlement(key, "", {"tokens": -40.0}),
                KeySettlement(other, "", {"tokens": 5.0}),
                KeySettlement(key, "", {"tokens": 12.0}),
                KeySettlement(slotted, "a", {"tokens": -10.0}),
                KeySettlement(key, "", {"tokens": -3.0}),
                KeySettlement(slotted, "b", {"tokens": -10.0}),
            ]
            with ScriptMonitor(redis_url) as monitor:
                settling = [asyncio.ensure_future(limiter.settle(s)) for s in settlements]
                await asyncio.sleep(0)  # all of them wait in the batch...
                await limiter.key_snapshot(other)  # ...for this urgent call
                outcomes = await asyncio.gather(*settling, return_exceptions=True)
            return monitor.ran, outcomes
        finally:
            await limiter.aclose()

    ran, outcomes = asyncio.run(settle_together())
    assert not any(isinstance(outcome, BaseException) for outcome in outcomes)
    # k's three settlements as one call, o's, p's two (slot releases stay calls of their
    # own), the snapshot.
    assert sorted(ran) == sorted(["settle_key"] * 4 + ["key_snapshot"])


def tpm_window(limit: float) -> Window:
    return Window(window_name("tokens", 60.0), "tokens", Rate(limit, 60.0, limit))


def _wait_for_settlements(proxy: ProxyInThread) -> None:
    """Settlements run in the background or linger for the next batch (batch.py): wait
    until none is pending."""
    pipeline = proxy.app.state.pipeline
    batch = pipeline.limiter._shared.runner._batch
    deadline = time.monotonic() + 5
    while (pipeline.background._tasks or batch.pending) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the last batch's round trip (0.05 s was too short on a busy host)


def test_deferred_requests_of_a_key_queue_locally_so_asks_do_not_grow_with_waiters(
    upstream: FakeUpstreamHandle, redis_url: str
) -> None:
    # A saturated model (10 a second) shared by a heavy key (30 requests at once) and a
    # light one (5): most requests are deferred for the fair share. Only the head of each
    # key's line asks again: a request asks on arrival, about once more for its share and
    # once for its turn, a few reservations in all, not one per deferral of every waiter
    # at the same moment (591 reservations for these 35 requests without the lines).
    config = {
        "redis": {"url": redis_url},
        "keys": [{"name": "heavy", "key": "sk-heavy"}, {"name": "light", "key": "sk-light"}],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url, "rpm": 600}]}
        ],
        "routing": {"max_wait": "30s", "lookahead": "500ms", "max_queue": 100},
    }

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(key: str) -> int:
                headers = {"authorization": f"Bearer {key}"}
                reply = await client.post(f"{url}/chat/completions", json=CHAT, headers=headers)
                return reply.status_code

            keys = ["sk-heavy"] * 30 + ["sk-light"] * 5
            return list(await asyncio.gather(*(one(key) for key in keys)))

    with ProxyInThread(settings_from(config)) as proxy, ScriptMonitor(redis_url) as monitor:
        statuses = asyncio.run(burst(proxy.base_url))
        _wait_for_settlements(proxy)
    reservations = monitor.ran.count("reserve_deployment")
    print(f"\n35 requests, {reservations} reservations")
    assert statuses == [200] * 35
    assert reservations <= 4 * 35
