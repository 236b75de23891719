"""Fail-open / fail-closed: the circuit breaker, the local share, and a real Redis that
dies and comes back mid-test. Breaker and local limiter run on an injected clock; only
Redis's own heartbeat clock is real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from support.limits import RULE, Clock, rpm, tpm, unusable
from support.redis_server import RedisServer

from proxy.costs import NOTHING, estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    LimiterMode,
    LimiterUnavailable,
    Outcome,
    Quota,
    Rate,
    Remaining,
    StorageError,
)
from proxy.limiter.core.quota import quota_name
from proxy.limiter.factory import create_limiter
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.policy import (
    OUTAGE_MARGIN,
    CircuitBreaker,
    CircuitState,
    OnError,
    ResilientLimiter,
    share,
    share_key,
)
from proxy.limiter.redis.backend import RedisLimiter

# -- circuit breaker -------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(failure_threshold=3, reset_after=1.0, clock=Clock(1000.0))
    for _ in range(2):
        breaker.record_failure()
    breaker.record_success()  # resets the count
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED and breaker.try_acquire()
    breaker.record_failure()
    assert breaker.state.value == "open" and not breaker.try_acquire()


def test_breaker_lets_one_probe_through_after_reset_after() -> None:
    clock = Clock(1000.0)
    changes: list[CircuitState] = []
    breaker = CircuitBreaker(1, reset_after=1.0, clock=clock, on_change=changes.append)
    breaker.record_failure()
    clock.now += 0.999
    assert not breaker.try_acquire()
    clock.now += 0.001
    assert breaker.try_acquire()  # the probe
    assert not breaker.try_acquire()  # others keep skipping while it is in flight
    breaker.record_failure()  # probe failed: open again, for a full reset_after
    assert breaker.state is CircuitState.OPEN and not breaker.try_acquire()
    clock.now += 1.0
    assert breaker.try_acquire()
    breaker.record_success()
    assert breaker.state.value == "closed"
    assert changes == [
        CircuitState.OPEN,
        CircuitState.HALF_OPEN,
        CircuitState.OPEN,
        CircuitState.HALF_OPEN,
        CircuitState.CLOSED,
    ]


def test_breaker_abandoned_probe_lets_the_next_call_probe() -> None:
    clock = Clock(1000.0)
    breaker = CircuitBreaker(1, reset_after=1.0, clock=clock)
    breaker.record_failure()
    clock.now += 1.0
    assert breaker.try_acquire()
    breaker.record_abandoned()  # e.g. the client disconnected mid-probe
    assert breaker.try_acquire()


# -- the local share -------------------------------------------------------------------


def test_share_divides_limit_and_capacity() -> None:
    assert share(Rate(600, 60, 600), 3, 1) == Rate(200, 60, 200)
    assert share(Rate(600, 60, 600), 1, 1) == Rate(600, 60, 600)


def test_share_keeps_room_for_one_request_the_whole_budget_accepts() -> None:
    assert share(Rate(60, 60, 1), 4, 1) == Rate(15, 60, 1)  # burst 1 stays 1
    assert share(Rate(1000, 60, 1000), 4, 600) == Rate(250, 60, 600)
    assert share(Rate(1000, 60, 1000), 4, 2000).capacity == 1000  # still too large


def test_share_key_divides_parallel_slots_keeping_one() -> None:
    key = KeyLimits("k", max_parallel=5)
    assert share_key(key, 2, NOTHING).max_parallel == 2
    assert share_key(key, 10, NOTHING).max_parallel == 1


def test_a_key_in_a_team_gets_its_share_of_the_teams_limits_too() -> None:
    team = KeyLimits("t", windows=(rpm(600),), max_parallel=8, scope="team")
    shared = share_key(KeyLimits("k", team=team), 4, NOTHING).team
    assert shared is not None and shared.scope == "team" and shared.max_parallel == 2
    assert shared.windows[0].rate == Rate(150, 60, 150)


# -- against a Redis that dies ---------------------------------------------------------

KEY = KeyLimits("team", windows=(rpm(10, 10),))
DEP = DeploymentLimits("d", windows=(rpm(60, 2),))


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
async def make(
    disposable_redis: RedisServer, clock: Clock
) -> AsyncIterator[Callable[[OnError, str], ResilientLimiter]]:
    """Build ResilientLimiters on the test's private Redis and clock."""
    made: list[ResilientLimiter] = []

    def build(on_error: OnError, replica_id: str = "a") -> ResilientLimiter:
        shared = RedisLimiter(
            disposable_redis.url,
            socket_timeout=0.5,
            connect_timeout=0.5,
            op_timeout=1.0,
            clock=clock,  # scripts get the test's time (heartbeats keep the server's)
        )
        limiter = ResilientLimiter(
            shared,
            on_error=on_error,
            replica_id=replica_id,
            failure_threshold=3,
            reset_after=1.0,
            clock=clock,
        )
        made.append(limiter)
        return limiter

    yield build
    for limiter in made:
        await limiter.aclose()


async def test_local_fallback_uses_this_replicas_share_then_recovers(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a, b = make("local", "a"), make("local", "b")
    await a.heartbeat()
    await b.heartbeat()
    await a.heartbeat()
    assert a.live_replicas == 2
    modes: list[LimiterMode] = []
    a.on_mode_change(modes.append)
    assert (await a.acquire_key(KeyAsk(KEY, "r0", estimate_cost(0)))).allowed
    assert a.mode is LimiterMode.SHARED and not a.fallback_active

    disposable_redis.kill()
    verdicts = [await a.acquire_key(KeyAsk(KEY, f"r{i}", estimate_cost(0))) for i in range(1, 11)]
    # Every call is answered, from the local half: 10 RPM / 2 replicas = 5 at once.
    assert sum(v.allowed for v in verdicts) == 5
    assert {v.code for v in verdicts if not v.allowed} == {"key_rpm"}
    assert a.fallback_active and a.ready and not a.storage_available
    assert a.circuit is CircuitState.OPEN
    assert modes == [LimiterMode.FALLBACK]
    deployment = await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0))
    assert deployment.deployment_id == "d"  # local share of the deployment too

    disposable_redis.start()  # empty: the shared budget is whole again
    clock.now += 1.0  # reset_after: the next call probes
    verdicts = [await a.acquire_key(KeyAsk(KEY, f"s{i}", estimate_cost(0))) for i in range(10)]
    assert all(v.allowed for v in verdicts)  # shared budget, not the local 5
    assert a.mode is LimiterMode.SHARED and a.storage_available
    assert modes == [LimiterMode.FALLBACK, LimiterMode.SHARED]


async def test_no_lease_answers_a_reservation_while_the_circuit_is_open(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    """Neither an open lease nor a lease renewal on its way answers while the storage
    is not trusted: the local share does (``reserve``)."""
    a = make("local", "a")
    await a.heartbeat()
    disposable_redis.kill()
    for i in range(3):  # the failure threshold
        await a.acquire_key(KeyAsk(KEY, f"r{i}", estimate_cost(0)))
    assert a.circuit is CircuitState.OPEN
    ask = GroupAsk("g", [DEP], estimate_cost(0), max_wait=0)
    assert a.reserve_now(ask) is None
    assert a.reserve_on_renewal(ask) is None
    assert (await a.reserve(ask)).deployment_id == "d"  # the local share


async def test_reject_raises_limiter_unavailable(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a = make("reject", "a")
    assert (await a.acquire_key(KeyAsk(KEY, "r0", estimate_cost(0)))).allowed
    disposable_redis.kill()
    for _ in range(4):  # erroring calls and then the open circuit: all rejected
        with pytest.raises(LimiterUnavailable):
            await a.acquire_key(KeyAsk(KEY, "r1", estimate_cost(0)))
    with pytest.raises(LimiterUnavailable):
        await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0))
    assert a.mode is LimiterMode.UNAVAILABLE and not a.ready and not a.fallback_active
    # Settlements never raise: leases expire, corrections are best effort.
    await a.settle(KeySettlement(KEY, "r0", {"tokens": -5}))
    await a.settle(DeploymentSettlement("g", DEP, RULE, cost={"requests": -1}))

    disposable_redis.start()
    clock.now += 1.0
    assert (await a.acquire_key(KeyAsk(KEY, "r2", estimate_cost(0)))).allowed
    assert a.mode.value == "shared" and a.ready


TOKENS_KEY = KeyLimits("tokens", windows=(tpm(1000, 1000),))


async def test_a_key_settlement_without_a_task_lands_as_an_awaited_one(
    make: Callable[[OnError, str], ResilientLimiter],
) -> None:
    a = make("local", "a")
    sooner, awaited = (
        KeyLimits("soon", TOKENS_KEY.windows),
        KeyLimits("awaited", TOKENS_KEY.windows),
    )
    for key in (sooner, awaited):
        assert (await a.acquire_key(KeyAsk(key, "r", estimate_cost(600)))).allowed  # estimated 600
    # Used 100 of them: 500 back, one way without a task (it lingers for the next batch).
    assert a.settle_soon(KeySettlement(sooner, "r", {"tokens": -500}))
    await a.settle(KeySettlement(awaited, "r", {"tokens": -500}))
    soon_state, awaited_state = await a.key_snapshot(sooner), await a.key_snapshot(awaited)
    assert soon_state == awaited_state
    assert list(soon_state.remaining.values()) == [900]
    assert a.circuit is CircuitState.CLOSED


async def test_a_key_settlement_without_a_task_that_fails_counts_and_falls_back(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    a = make("local", "a")
    failed: list[str] = []
    a.on_storage_error(failed.append)
    assert (await a.acquire_key(KeyAsk(TOKENS_KEY, "r", estimate_cost(600)))).allowed
    disposable_redis.kill()
    assert a.settle_soon(KeySettlement(TOKENS_KEY, "r", {"tokens": -500}))  # handed over: no raise
    await a.acquire_key(
        KeyAsk(KEY, "next", estimate_cost(0))
    )  # its batch carries the settlement: fails
    assert failed[:2] == ["settle", "acquire_key"]


async def test_no_key_settlement_goes_without_a_task_while_an_outage_is_carried_over(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    a = make("local", "a")
    disposable_redis.kill()
    for _ in range(3):  # open the circuit: reservations are local now
        await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0))
    disposable_redis.start()
    # The local turns must reach the shared windows first: that needs the awaited path.
    assert not a.settle_soon(KeySettlement(TOKENS_KEY, "r", {"tokens": -1}))


async def test_leases_taken_locally_are_released_locally(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a = make("local", "a")
    key = KeyLimits("p", max_parallel=1)
    disposable_redis.kill()
    for _ in range(3):  # open the circuit
        await a.acquire_key(KeyAsk(KeyLimits("other"), "x", estimate_cost(0)))
    assert (await a.acquire_key(KeyAsk(key, "held", estimate_cost(0)))).allowed
    assert not (await a.acquire_key(KeyAsk(key, "second", estimate_cost(0)))).allowed
    disposable_redis.start()
    clock.now += 1.0
    await a.heartbeat()  # the heartbeat probes and closes the circuit
    assert a.mode is LimiterMode.SHARED
    await a.settle(KeySettlement(key, "held", {}))
    assert a.local.leases_held("p") == 0


async def test_a_teams_slot_taken_locally_is_released_locally(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a = make("local", "a")
    key = KeyLimits("p", team=KeyLimits("t", max_parallel=1, scope="team"))
    disposable_redis.kill()
    for _ in range(3):  # open the circuit
        await a.acquire_key(KeyAsk(KeyLimits("other"), "x", estimate_cost(0)))
    assert (await a.acquire_key(KeyAsk(key, "held", estimate_cost(0)))).allowed
    refused = await a.acquire_key(KeyAsk(key, "second", estimate_cost(0)))
    assert (refused.allowed, refused.code) == (False, "team_parallel")
    disposable_redis.start()
    clock.now += 1.0
    await a.heartbeat()
    assert a.mode is LimiterMode.SHARED
    await a.settle(KeySettlement(key, "held"))  # goes where its slot was taken
    assert not a.local.holds_slot(key, "held")


async def test_heartbeat_task_and_leaving(disposable_redis: RedisServer) -> None:
    def build(replica: str) -> ResilientLimiter:
        shared = RedisLimiter(disposable_redis.url, op_timeout=1.0)
        return ResilientLimiter(
            shared, on_error="local", replica_id=replica, heartbeat_interval=0.02
        )

    a, b = build("a"), build("b")
    await a.start()
    await b.start()
    try:
        await _eventually(lambda: a.live_replicas == 2)
        await b.aclose()  # leaves the set at once, not after replica_ttl
        await _eventually(lambda: a.live_replicas == 1)
    finally:
        await a.aclose()
        await b.aclose()


async def test_heartbeats_share_each_replicas_pacing_need(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    """catalog/pacing.py: each heartbeat carries this replica's need and hands back the
    live replicas'; with the storage down, nothing is heard (the last heard stands)."""
    a, b = make("local", "a"), make("local", "b")
    heard: list[dict[str, float]] = []
    a.share_pacing(lambda: 0.012, lambda needs: heard.append(dict(needs)))
    b.share_pacing(lambda: 0.048, lambda needs: None)
    await b.heartbeat()
    await a.heartbeat()
    assert heard[-1] == {"a": 0.012, "b": 0.048}
    disposable_redis.kill()
    await a.heartbeat()
    assert len(heard) == 1


async def test_mode_listener_errors_do_not_break_the_limiter(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    a = make("local", "a")

    def broken(mode: LimiterMode) -> None:
        raise RuntimeError("metrics are down")

    a.on_mode_change(broken)
    disposable_redis.kill()
    for i in range(4):
        assert (await a.acquire_key(KeyAsk(KEY, f"r{i}", estimate_cost(0)))).allowed
    assert a.fallback_active


# -- deployment health through the policy ----------------------------------------------

AUTH = Outcome("failure", "auth", cool_for=5.0)
OTHER = DeploymentLimits("e", windows=(rpm(60, 2),))


async def test_health_and_in_flight_are_shared_by_replicas(
    make: Callable[[OnError, str], ResilientLimiter],
) -> None:
    a, b = make("local", "a"), make("local", "b")
    first = await a.reserve(
        GroupAsk("g", [DEP, OTHER], estimate_cost(0), 0, slot="r1", least_busy=True)
    )
    assert first.deployment_id == "d"
    # b sees a's request in flight on d...
    second = await b.reserve(
        GroupAsk("g", [DEP, OTHER], estimate_cost(0), 0, slot="r2", least_busy=True)
    )
    assert second.deployment_id == "e"
    # ...and the cooldown a's settlement started.
    change = await a.settle(DeploymentSettlement("g", DEP, slot="r1", outcome=AUTH, rule=RULE))
    assert change == HealthChange(cooled=True, cool_for=5.0)
    verdict = await b.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0))
    assert verdict.deployment_id is None and verdict.cooling and verdict.retry_after == 5.0
    assert await unusable(b, "g", [DEP, OTHER]) == {"d": 5.0, "e": 0.0}
    await b.settle(
        DeploymentSettlement(
            "g", OTHER, RULE, remaining=Remaining(requests=0, requests_wait=30, tokens=None)
        )
    )
    assert (
        await a.reserve(GroupAsk("g", [OTHER], estimate_cost(0), max_wait=0))
    ).deployment_id is None


async def test_local_fallback_keeps_health_and_in_flight_locally(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a = make("local", "a")
    disposable_redis.kill()
    for _ in range(3):  # failing calls: answered locally, and they open the circuit
        assert await unusable(a, "g", [DEP]) == {"d": 0.0}
    assert a.fallback_active
    verdict = await a.reserve(
        GroupAsk("g", [DEP, OTHER], estimate_cost(0), 0, slot="r1", least_busy=True)
    )
    assert verdict.deployment_id == "d" and a.local.in_flight("g", "d") == 1
    change = await a.settle(DeploymentSettlement("g", DEP, slot="r1", outcome=AUTH, rule=RULE))
    assert change == HealthChange(cooled=True, cool_for=5.0)
    assert a.local.in_flight("g", "d") == 0
    assert await unusable(a, "g", [DEP, OTHER]) == {"d": 5.0, "e": 0.0}
    refused = await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=1))
    assert refused.deployment_id is None and refused.cooling and refused.retry_after == 5.0
    await a.settle(
        DeploymentSettlement(
            "g", OTHER, RULE, remaining=Remaining(requests=0, requests_wait=30, tokens=0)
        )
    )
    assert (
        await a.reserve(GroupAsk("g", [OTHER], estimate_cost(0), max_wait=0))
    ).retry_after == 30.0
    clock.now += 5.0
    probe = await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0, slot="p"))
    assert probe.deployment_id == "d" and probe.probe


async def test_a_request_reserved_locally_is_settled_locally(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    a = make("local", "a")
    disposable_redis.kill()
    for _ in range(3):
        await a.reserve(GroupAsk("g", [OTHER], estimate_cost(0), max_wait=0))
    reserved = await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), 0, slot="r", least_busy=True))
    assert reserved.deployment_id == "d"
    disposable_redis.start()
    clock.now += 1.0
    await a.heartbeat()  # closes the circuit
    assert a.mode is LimiterMode.SHARED
    change = await a.settle(DeploymentSettlement("g", DEP, slot="r", outcome=AUTH, rule=RULE))
    assert change.cooled and a.local.in_flight("g", "d") == 0
    # The cooldown was decided locally: the shared health never heard of it.
    assert await unusable(a, "g", [DEP]) == {"d": 0.0}


async def test_budget_settlements_an_outage_kept_from_redis_are_paid_once_it_is_back(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    """A correction the open circuit kept from Redis, and the whole cost of a request
    admitted locally (its reservation never reached Redis), are paid at the first good
    heartbeat after the outage: Redis's budget ends as what the requests cost."""
    a = make("local", "a")
    budget = Quota(quota_name("usd", "month"), "usd", 100.0, "month")
    key = KeyLimits("k", quotas=(budget,))
    first = await a.acquire_key(KeyAsk(key, "r1", NOTHING, budget_cost={"usd": 1.0}))
    disposable_redis.freeze()
    try:
        for _ in range(3):  # calls that time out (Redis runs them once it wakes): open
            await a.reserve(GroupAsk("g", [OTHER], estimate_cost(0), max_wait=0))
        assert a.mode is LimiterMode.FALLBACK
        second = await a.acquire_key(KeyAsk(key, "r2", NOTHING, budget_cost={"usd": 1.0}))
        assert second.allowed
        await a.settle(KeySettlement(key, "r1", budget_cost={"usd": -0.5}, started=first.at))
        a.settle_soon(KeySettlement(key, "r2", budget_cost={"usd": -0.25}, started=second.at))
        assert a.owed == 1  # one key, one day: summed
    finally:
        disposable_redis.thaw()
    clock.now += 1.0
    await a.heartbeat()  # closes the circuit, and pays
    assert a.mode is LimiterMode.SHARED and a.owed == 0
    [(_, left)] = (await a.key_snapshot(key)).budgets
    assert left.remaining == pytest.approx(100.0 - (0.5 + 0.75))


async def test_reject_refuses_reservations_and_settles_nothing(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    a = make("reject", "a")
    disposable_redis.kill()
    for _ in range(4):  # erroring calls and then the open circuit
        with pytest.raises(LimiterUnavailable):
            await a.reserve(
                GroupAsk("g", [DEP], estimate_cost(0), max_wait=0, slot="r", least_busy=True)
            )
    # Never raise: give up with neutral answers.
    change = await a.settle(
        DeploymentSettlement("g", DEP, slot="r", outcome=AUTH, rule=RULE, cost={"tokens": -5})
    )
    assert change == HealthChange()
    await a.settle(
        DeploymentSettlement(
            "g", DEP, RULE, remaining=Remaining(requests=0, requests_wait=5, tokens=0)
        )
    )
    assert await unusable(a, "g", [DEP, OTHER]) == {"d": 0.0, "e": 0.0}
    assert a.mode is LimiterMode.UNAVAILABLE


async def test_new_operations_failing_in_the_storage_are_answered_locally(
    make: Callable[[OnError, str], ResilientLimiter], disposable_redis: RedisServer
) -> None:
    a = make("local", "a")
    reserved = await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), 0, slot="r", least_busy=True))
    assert reserved.deployment_id == "d"
    disposable_redis.kill()
    # The circuit is still closed: each call tries Redis, fails, and falls back.
    change = await a.settle(DeploymentSettlement("g", DEP, slot="r", outcome=AUTH, rule=RULE))
    assert change.cooled
    await a.settle(
        DeploymentSettlement(
            "g", DEP, RULE, remaining=Remaining(requests=1, requests_wait=1, tokens=None)
        )
    )
    assert await unusable(a, "g", [DEP]) == {"d": 5.0}
    assert a.fallback_active


async def _eventually(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


# -- the factory -----------------------------------------------------------------------


async def test_create_limiter_without_redis_is_in_memory() -> None:
    for url in (None, ""):
        limiter = create_limiter(url, "local", "r1")
        assert isinstance(limiter, MemoryLimiter)
        assert limiter.mode is LimiterMode.MEMORY and limiter.ready
        assert not limiter.fallback_active
        await limiter.start()
        await limiter.aclose()


async def test_create_limiter_with_redis(redis_url: str) -> None:
    limiter = create_limiter(redis_url, "reject", "r1", timeout=0.5)
    assert isinstance(limiter, ResilientLimiter)
    await limiter.start()
    assert (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(0)))).allowed
    assert limiter.mode is LimiterMode.SHARED
    await limiter.aclose()


def test_create_limiter_rejects_unknown_on_error() -> None:
    with pytest.raises(ValueError):
        create_limiter("redis://127.0.0.1:1", "maybe", "r1")


async def test_storage_errors_are_reported_by_operation(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
) -> None:
    a = make("local", "a")
    failed: list[str] = []
    a.on_storage_error(failed.append)
    assert (await a.acquire_key(KeyAsk(KEY, "r0", estimate_cost(0)))).allowed
    assert failed == []
    disposable_redis.kill()
    await a.acquire_key(KeyAsk(KEY, "r1", estimate_cost(0)))
    await a.reserve(GroupAsk("g", [DEP], estimate_cost(0), max_wait=0))
    # Each call that reached the storage and failed is named; an open circuit asks none.
    assert failed[:2] == ["acquire_key", "reserve"]


# -- turns across an outage --------------------------------------------------------------

PACED = DeploymentLimits("p", windows=(rpm(60, 1),))  # one request a second


async def test_a_local_share_starts_after_the_turns_redis_handed_out(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    """Turns already granted in Redis still go out during the outage: the local share
    hands out none before the last of them (plus the margin for other replicas')."""
    a = make("local", "a")
    shared = [
        await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10)) for _ in range(5)
    ]
    assert [v.wait for v in shared] == [0.0, 1.0, 2.0, 3.0, 4.0]
    disposable_redis.kill()
    first_local = await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10))
    assert first_local.wait == pytest.approx(4.0 + OUTAGE_MARGIN)
    assert first_local.sent is not None and first_local.sent.private.fallback
    second = await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10))
    assert second.wait == pytest.approx(5.0 + OUTAGE_MARGIN)  # then at the share's pace


async def test_back_from_an_outage_redis_hands_out_no_turn_before_the_local_ones(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    """A restarted Redis is empty: the first call after the outage carries this replica's
    local turns over, so shared turns start after them (plus reset_after, the longest
    another replica may still hand out local turns, and the margin)."""
    a = make("local", "a")
    disposable_redis.kill()
    local = [
        await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10)) for _ in range(4)
    ]
    assert [v.wait for v in local] == [0.0, 1.0, 2.0, 3.0]
    disposable_redis.start()
    clock.now += 1.0  # reset_after: the next call probes
    back = await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10))
    assert a.mode is LimiterMode.SHARED
    assert back.sent is not None and not back.sent.private.fallback
    # The last local turn is 2 s from now; then reset_after (1 s) and the margin.
    assert back.wait == pytest.approx(2.0 + 1.0 + OUTAGE_MARGIN)


async def test_a_429_on_a_turn_the_other_side_granted_only_holds(
    make: Callable[[OnError, str], ResilientLimiter],
    disposable_redis: RedisServer,
    clock: Clock,
) -> None:
    """Its epoch and sequence count Redis's turns: the local health must not learn a
    rate from them (it would pace from a count it never kept)."""
    a = make("local", "a")
    turns = [
        await a.reserve(GroupAsk("g", [PACED], estimate_cost(0), max_wait=10)) for _ in range(5)
    ]
    disposable_redis.kill()
    rate_limited = Outcome("failure", "rate_limited", cool_for=2.0, rate_limited=True)
    change = await a.settle(
        DeploymentSettlement("g", PACED, RULE, rate_limited, sent=turns[-1].sent)
    )
    assert change.cooled and change.epoch == 0  # held, nothing learned
    assert a.local.health_of("g", "p").learned == 0.0


# -- one failed call is no outage ---------------------------------------------------------


class _LostReplies(RedisLimiter):
    """The real Redis limiter, whose next ``lose`` reservations run in Redis but whose
    replies are lost on the way back (a reply later than the socket timeout)."""

    lose = 0
    batch: StorageError | None = None  # set: the lost replies were one batch's

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        verdict = await super().reserve(ask)
        if self.lose > 0:
            self.lose -= 1
            raise self.batch or StorageError("redis limiter: TimeoutError: reply too late")
        return verdict


async def test_a_reservation_whose_reply_is_lost_is_asked_again_not_answered_locally(
    disposable_redis: RedisServer, clock: Clock
) -> None:
    """A lost reply while the circuit stays closed: the reservation is asked again in
    Redis (the lost turn is only wasted), not answered from the local share, which would
    add a turn beside the other replicas' and then hold the shared schedule back for
    reset_after and the margin. One batch failing is one failure for the breaker."""
    shared = _LostReplies(disposable_redis.url, op_timeout=1.0, clock=clock)
    a = ResilientLimiter(shared, on_error="local", replica_id="a", clock=clock)
    try:
        ask = GroupAsk("g", [PACED], estimate_cost(0), max_wait=10)
        assert (await a.reserve(ask)).wait == 0.0
        shared.lose = 1
        again = await a.reserve(ask)
        assert again.sent is not None and not again.sent.private.fallback
        assert again.wait == 2.0  # turn 1 was taken by the lost call: wasted, not doubled
        assert (await a.reserve(ask)).wait == 3.0  # no hold carried over: paced on
        assert a.mode is LimiterMode.SHARED
        shared.lose = 2  # lost twice: still asked again until the circuit opens
        assert (await a.reserve(ask)).wait == 6.0
        assert a.mode is LimiterMode.SHARED
        # Three calls of one batch lost together: one failure, and each asked again.
        shared.lose, shared.batch = 3, StorageError("redis limiter: TimeoutError: batch")
        patient = GroupAsk("g", [PACED], estimate_cost(0), max_wait=30)
        verdicts = await asyncio.gather(*(a.reserve(patient) for _ in range(3)))
        assert a.mode is LimiterMode.SHARED
        assert all(v.sent is not None and not v.sent.private.fallback for v in verdicts)
    finally:
        await a.aclose()


async def test_answers_from_a_lease_tell_the_breaker_nothing_of_the_storage(
    disposable_redis: RedisServer, clock: Clock
) -> None:
    """Consecutive storage failures open the circuit even with requests in between that
    the key's lease answered and settled alone: no call was made, so none counts as a
    storage success (each used to reset the count of failures)."""
    shared = RedisLimiter(disposable_redis.url, socket_timeout=0.5, connect_timeout=0.5)
    a = ResilientLimiter(shared, on_error="local", replica_id="a", failure_threshold=3, clock=clock)
    leased = KeyLimits("leased", windows=(rpm(1_000_000, 1_000_000), tpm(10**9, 10**9)))
    other = KeyLimits("other", windows=(rpm(1_000_000, 1_000_000),))
    try:
        # The key's second request takes a lease (leases.WARM_USES: it is busy).
        assert (await a.acquire_key(KeyAsk(leased, "w", estimate_cost(600)))).allowed
        assert (await a.acquire_key(KeyAsk(leased, "r", estimate_cost(600)))).allowed
        disposable_redis.kill()
        for i in range(3):
            assert (await a.acquire_key(KeyAsk(other, f"o{i}", estimate_cost(0)))).allowed
            assert a.circuit is (CircuitState.OPEN if i == 2 else CircuitState.CLOSED)
            if i < 2:  # the lease's, in the awaited way and without a task
                ask = KeyAsk(leased, f"r{i}", estimate_cost(600))
                assert (await a.acquire_key(ask)).allowed
                assert a.settle_soon(KeySettlement(leased, f"r{i}", {"tokens": -500}))
                await a.settle(KeySettlement(leased, "r", {"tokens": -500}))
    finally:
        await a.aclose()
