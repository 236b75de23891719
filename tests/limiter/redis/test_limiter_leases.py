"""The Redis backend's leases (leases.py, lua/lease*.lua) on a real redis-server: the
scripts compute what allowance.py does, a replica far from its limits admits without a
round trip per request, and replicas leasing from one key never pass more than it
allows."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.limits import patient, window
from support.redis_server import RedisServer

from loadtest.redis_calls import script_calls as calls
from proxy.costs import estimate_cost
from proxy.limiter.base import (
    CooldownRule,
    DeploymentLimits,
    DeploymentSettlement,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    Outcome,
    Rate,
)
from proxy.limiter.core.allowance import (
    FIRST_REQUESTS,
    HOLD,
    USE_SHARE,
    Allowance,
    lease_floor,
    lease_hold,
    lease_refund,
)
from proxy.limiter.core.bucket import Bucket, BucketState, Plan, adjust, charge, debt_at
from proxy.limiter.policy import CircuitState, ResilientLimiter
from proxy.limiter.redis import scripts
from proxy.limiter.redis.backend import RedisLimiter
from proxy.limiter.redis.leases import WARM_USES

DAILY = KeyLimits("team-a", windows=(window("requests", 2000, 86400.0),))
BIG = KeyLimits("team-b", windows=(window("requests", 1e6), window("tokens", 1e8)))
DEP = DeploymentLimits("openai-a", windows=(window("requests", 1e6, 60.0, 1e5),))
RULE = CooldownRule(allowed_fails=1, window=60.0, time=30.0)


async def warm(url: str, **options: Any) -> RedisLimiter:
    """A limiter that has loaded its functions (so calls() counts only operations)."""
    lim = patient(url, **options)
    await lim.key_snapshot(BIG)
    return lim


def quick_to_open(url: str) -> ResilientLimiter:
    """A limiter whose circuit opens at the first failed call, and soon; it leases a
    deployment from its first request."""
    shared = RedisLimiter(url, op_timeout=0.5, connect_timeout=0.5, lease_warm_uses=0)
    return ResilientLimiter(shared, on_error="local", replica_id="r", failure_threshold=1)


def test_lease_scripts_compute_what_allowance_does(redis_url: str) -> None:
    rate = Rate(6000.0, 60.0, 6000.0)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.hset("w", mapping={"d": "1000", "t": "10"})
        lease = c.eval(
            scripts.source("lease_key"), 1, "w", "11", repr(rate.interval), "6000.0", "6000.0",
            "1.0", "40.0",
        )  # fmt: skip
        debt0 = 1000.0 - 1.0 / rate.interval  # drained for a second
        hold = lease_hold([debt0], [40.0], [rate])
        assert lease[0] == "leased"
        assert [float(x) for x in lease[1:]] == [11.0, hold, debt0]
        assert float(c.hget("w", "d")) == max(debt0, hold / rate.interval) + 40.0
        before = float(c.hget("w", "d"))
        mark = repr(before)  # the debt it left: Allowance.marks
        c.eval(
            scripts.source("return_lease"), 1, "w", "11.1", "11", repr(hold),
            repr(rate.interval), "40.0", "7.5", mark,
        )  # fmt: skip
        refund = lease_refund(40.0, 7.5, hold, 11.1 - 11.0, last=True)
        drained = before - 0.1 / rate.interval
        assert math.isclose(float(c.hget("w", "d")), drained - refund, abs_tol=1e-9)
        # After its hold, nothing goes back (nothing is written).
        c.eval(
            scripts.source("return_lease"), 1, "w", "11.6", "11", repr(hold),
            repr(rate.interval), "40.0", "0.0", mark,
        )  # fmt: skip
        assert c.hget("w", "t") == "11.1"


def test_a_lease_taken_since_keeps_the_units_of_the_one_before(redis_url: str) -> None:
    """return_lease gives back only to a bucket whose last lease it is (allowance.py):
    a lease taken later may have counted on the earlier one's units for its hold."""
    rate = Rate(60000.0, 60.0, 30000.0)
    i, cap = repr(rate.interval), repr(rate.capacity)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("w")
        first = c.eval(scripts.source("lease_key"), 1, "w", "0", i, cap, cap, "17.0", "272.0")
        mark = c.hget("w", "d")
        c.eval(scripts.source("lease_key"), 1, "w", "0.25", i, cap, cap, "1.0", "8.0")
        before = c.hgetall("w")
        c.eval(
            scripts.source("return_lease"), 1, "w", "0.4375", "0", first[2], i, "272.0",
            "17.0", mark,
        )  # fmt: skip
        assert c.hgetall("w") == before  # nothing given back, nothing written


def test_a_refund_keeps_the_units_a_later_lease_counted_on(redis_url: str) -> None:
    """settle_key's refund stops at the bucket's floor (allowance.lease_floor): a request
    asked 600 units at 0 s, another replica leased 8 (its hold, 0.5 s, covered by the
    600); the request settles at 0.1 s having used 10. The debt keeps the lease's hold
    and units, 408 (not 0); once they have drained, a refund comes back whole."""
    rate = Rate(60000.0, 60.0, 30000.0)
    i, cap = repr(rate.interval), repr(rate.capacity)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("w")
        c.hset("w", mapping={"d": "600", "t": "0"})  # the request's ask
        reply = c.eval(scripts.source("lease_key"), 1, "w", "0", i, cap, cap, "1.0", "8.0")
        assert reply[0] == "leased" and float(c.hget("w", "d")) == 608.0
        c.eval(scripts.source("settle_key"), 3, "s", "s", "w", "0.1", "", i, "-590.0")
        assert math.isclose(float(c.hget("w", "d")), 408.0)
        c.eval(scripts.source("settle_key"), 3, "s", "s", "w", "2", "", i, "10.0")
        c.eval(scripts.source("settle_key"), 3, "s", "s", "w", "2.001", "", i, "-10.0")
        assert float(c.hget("w", "d")) == 0.0


def test_a_deployment_refund_keeps_the_units_its_lease_counted_on(redis_url: str) -> None:
    """settle_deployment's correction stops at the floor too (the same adjust)."""
    rate = Rate(60000.0, 60.0, 30000.0)
    i, cap = repr(rate.interval), repr(rate.capacity)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("h", "f", "l", "w")
        c.hset("w", mapping={"d": "600", "t": "0"})  # a turn's estimate
        reply = c.eval(
            scripts.source("lease_deployment"), 3, "h", "l", "w", "0", "8", i, cap, "8.0"
        )
        assert reply[0] == "1" and float(c.hget("w", "d")) == 608.0
        c.eval(
            scripts.source("settle_deployment"), 4, "h", "f", "l", "w", "0.1", "", "neutral",
            "", "0", "1", "60", "30", "", "", "", "", "1", "0", "0", "60", i, "-590.0",
        )  # fmt: skip
        assert math.isclose(float(c.hget("w", "d")), 408.0)


def test_a_key_too_full_to_lease_from_is_checked_as_acquire_key_checks_it(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.hset("w", mapping={"d": "5999", "t": "10"})
        reply = c.eval(
            scripts.source("lease_key"), 1, "w", "10", "0.01", "6000.0", "6000.0", "2.0", "40.0"
        )
        assert reply[:3] == ["checked", "refused", "0"]
        assert c.hget("w", "d") == "5999"


async def test_far_from_its_limits_a_key_costs_a_round_trip_per_lease(redis_url: str) -> None:
    lim = await warm(redis_url)
    before = calls(redis_url)
    for i in range(40):
        verdict = await lim.acquire_key(KeyAsk(BIG, f"r{i}", estimate_cost(100.0)))
        assert verdict.allowed
        await lim.settle(KeySettlement(BIG, f"r{i}", cost={"tokens": -50.0}))
    # The first request asks (and settles) alone: nothing says yet that the key is
    # busy. Then leases of 8, 16, 32 requests: three round trips (and two give-backs
    # riding along).
    assert calls(redis_url) - before <= 8
    await lim.aclose()


async def test_a_key_whose_requests_come_far_apart_is_never_leased(redis_url: str) -> None:
    """A lease would serve one request and cost two round trips (lease, give back): each
    request asks, and settles, by itself."""
    lim = await warm(redis_url)
    before = calls(redis_url)
    for i in range(4):
        verdict = await lim.acquire_key(KeyAsk(BIG, f"r{i}", estimate_cost(100.0)))
        assert verdict.allowed
        await lim.settle(KeySettlement(BIG, f"r{i}", cost={"tokens": -50.0}))
        await asyncio.sleep(HOLD * USE_SHARE / WARM_USES + 0.01)
    assert calls(redis_url) - before == 8
    await lim.aclose()


async def test_a_replica_alone_leaves_the_key_as_if_it_asked_per_request(redis_url: str) -> None:
    lim = patient(redis_url)
    for i in range(50):
        assert (await lim.acquire_key(KeyAsk(DAILY, f"r{i}", estimate_cost(0)))).allowed
    await lim.aclose()  # gives its lease back
    reader = patient(redis_url, leases=False)
    state = await reader.key_snapshot(DAILY)
    await reader.aclose()
    assert math.isclose(state.remaining["rpd"], 1950.0, abs_tol=0.1)


async def test_replicas_leasing_from_one_key_pass_exactly_its_limit(redis_url: str) -> None:
    replicas = [patient(redis_url) for _ in range(3)]

    async def ask(lim: RedisLimiter, n: int) -> int:
        verdicts = await asyncio.gather(
            *(
                lim.acquire_key(KeyAsk(DAILY, f"{id(lim)}-{n}-{i}", estimate_cost(0)))
                for i in range(10)
            )
        )
        return sum(v.allowed for v in verdicts)

    allowed = 0
    for n in range(100):
        allowed += sum(await asyncio.gather(*(ask(lim, n) for lim in replicas)))
    assert allowed <= 2000
    for lim in replicas:
        await lim.aclose()
    # What leases held and did not use went back, and once their holds are over (the
    # refill they reserved), the rest is there to take.
    await asyncio.sleep(HOLD)
    last = patient(redis_url, leases=False)
    while (await last.acquire_key(KeyAsk(DAILY, f"last-{allowed}", estimate_cost(0)))).allowed:
        allowed += 1
    await last.aclose()
    assert allowed == 2000


async def test_a_healthy_deployment_gives_turns_from_its_lease_until_it_fails(
    redis_url: str,
) -> None:
    lim = await warm(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [DEP], estimate_cost(10.0), max_wait=0.0, slot="r")
    before = calls(redis_url)
    turns = [await lim.reserve(ask) for _ in range(8)]
    assert all(t.deployment_id == "openai-a" and t.wait == 0.0 for t in turns)
    assert calls(redis_url) - before == 1
    sent = turns[-1].sent
    assert sent is not None and sent.private.lease
    # A failure closes the lease: the shared health hears of it and cools the deployment.
    failure = Outcome("failure", "server_error")
    await lim.settle(DeploymentSettlement("g", DEP, RULE, failure, "r", sent=sent))
    verdict = await lim.reserve(ask)
    assert verdict.deployment_id is None and verdict.cooling
    await lim.aclose()


async def test_a_turn_given_back_returns_to_the_lease(redis_url: str) -> None:
    lim = patient(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [DEP], estimate_cost(0), max_wait=0.0, slot="r")
    first = await lim.reserve(ask)
    before = calls(redis_url)
    unused = DeploymentSettlement(
        "g", DEP, RULE, slot="r", cost={"requests": -1.0}, sent=first.sent
    )
    await lim.settle(unused)
    assert calls(redis_url) == before
    await lim.aclose()


async def test_a_429_on_a_leased_turn_teaches_as_a_reserved_one_would(redis_url: str) -> None:
    free = DeploymentLimits("free", windows=(window("requests", 1e6, 60.0, 1e5),))
    lim = patient(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [free], estimate_cost(0), max_wait=5.0, slot="r")
    turns = [await lim.reserve(ask) for _ in range(8)]
    assert [t.sent.sequence for t in turns if t.sent] == list(range(1, 9))
    limited = Outcome("failure", "rate_limited", cool_for=1.0, rate_limited=True)
    await lim.settle(DeploymentSettlement("g", free, RULE, limited, "r", sent=turns[-1].sent))
    (state,) = (await lim.snapshot("g", [free])).values()
    assert state.learned > 0.0 and state.hold_for > 0.0
    # Learned: its turns go one by one again, paced, through the shared state.
    verdict = await lim.reserve(ask)
    assert verdict.wait > 0.0 and verdict.sent is not None and not verdict.sent.private.lease
    await lim.aclose()


async def test_a_deployment_without_limits_is_never_leased(redis_url: str) -> None:
    """Only its 429s tell its rate: every replica must hear of the first at once."""
    free = DeploymentLimits("free", probe_timeout=10.0)
    lim = patient(redis_url, lease_warm_uses=0)
    verdict = await lim.reserve(GroupAsk("g", [free], estimate_cost(0), max_wait=5.0, slot="r"))
    assert verdict.sent is not None and not verdict.sent.private.lease
    await lim.aclose()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limit=st.sampled_from([64.0, 1000.0, 6000.0, 1e6]),
    capacity_share=st.sampled_from([0.01, 0.5, 1.0]),
    debt_share=st.floats(0.0, 1.2),
    amount_share=st.floats(0.001, 0.6),
    elapsed=st.floats(0.0, 3.0),
    used_share=st.floats(0.0, 1.0),
)
def test_lua_leases_match_the_pure_core(
    redis_url: str,
    limit: float,
    capacity_share: float,
    debt_share: float,
    amount_share: float,
    elapsed: float,
    used_share: float,
) -> None:
    """lease.lua mirrors allowance.py: the same hold, the same charge, the same give-back,
    bit for bit."""
    rate = Rate(limit, 60.0, limit * capacity_share)
    debt, amount = debt_share * rate.capacity, amount_share * rate.capacity
    state = BucketState(debt, 100.0)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("w")
        c.hset("w", mapping={"d": repr(debt), "t": "100.0"})
        now = 100.0 + elapsed
        i, cap = repr(rate.interval), repr(rate.capacity)
        reply = c.eval(
            scripts.source("lease_key"), 1, "w", repr(now), i, cap, cap, "1.0", repr(amount)
        )
        debt0 = debt_at(state, rate.interval, now)
        hold = lease_hold([debt0], [amount], [rate])
        if hold == 0.0:
            assert reply[0] == "checked"
            return
        assert reply[0] == "leased" and [float(x) for x in reply[2:]] == [hold, debt0]
        (charged,) = charge([Bucket(state, rate, amount)], Plan((debt0,), hold, -1, -1), now)
        assert float(c.hget("w", "d")) == charged.debt
        (mark,) = Allowance(1, [rate], [amount], [debt0], now, hold, now, now, 1).marks
        assert mark == charged.debt
        later = now + elapsed / 4
        used = used_share * amount
        c.eval(
            scripts.source("return_lease"), 1, "w", repr(later), repr(now), repr(hold), i,
            repr(amount), repr(used), repr(mark),
        )  # fmt: skip
        refund = lease_refund(amount, used, hold, later - now, last=True)
        floor = lease_floor(BucketState(), rate, hold, amount, now)
        expected = charged
        if refund > 0.0:
            floor = adjust(floor, rate, -refund, later)
            expected = adjust(charged, rate, -refund, later, floor)
        assert float(c.hget("w", "d")) == expected.debt
        # A request's refund (settle_key) stops at the leases' floor.
        settled = later + elapsed / 8
        c.eval(scripts.source("settle_key"), 3, "s", "s", "w", repr(settled), "", i, repr(-debt))
        expected = adjust(expected, rate, -debt, settled, floor)
        assert float(c.hget("w", "d")) == expected.debt


async def test_a_key_check_its_lease_covers_is_answered_at_once(redis_url: str) -> None:
    lim = patient(redis_url)
    assert lim.acquire_key_now(KeyAsk(BIG, "r0", estimate_cost(10.0))) is None  # no lease yet: ask
    assert (await lim.acquire_key(KeyAsk(BIG, "w", estimate_cost(10.0)))).allowed  # alone
    assert (
        await lim.acquire_key(KeyAsk(BIG, "r0", estimate_cost(10.0)))
    ).allowed  # the key is busy: this one takes a lease
    verdict = lim.acquire_key_now(KeyAsk(BIG, "r1", estimate_cost(10.0)))
    assert verdict is not None and verdict.allowed
    await lim.aclose()


async def test_leases_answer_at_once_only_while_the_storage_is_trusted(
    disposable_redis: RedisServer,
) -> None:
    resilient = quick_to_open(disposable_redis.url)
    assert (await resilient.acquire_key(KeyAsk(BIG, "w", estimate_cost(10.0)))).allowed
    assert (await resilient.acquire_key(KeyAsk(BIG, "r0", estimate_cost(10.0)))).allowed
    assert resilient.acquire_key_now(KeyAsk(BIG, "r1", estimate_cost(10.0))) is not None
    disposable_redis.kill()
    # A call that needs the storage fails: the breaker opens, and the lease it still
    # holds answers no more (its verdicts would tell the breaker nothing).
    await resilient.reserve(
        GroupAsk("g", [DeploymentLimits("free")], estimate_cost(0), max_wait=0.0)
    )
    assert resilient.acquire_key_now(KeyAsk(BIG, "r2", estimate_cost(10.0))) is None
    await resilient.aclose()


async def test_a_settlement_its_lease_takes_whole_is_done_at_once_and_the_rest_goes_once(
    disposable_redis: RedisServer,
) -> None:
    # Windows that barely drain (30 days'), so the storage's debt reads exactly.
    month = 30 * 86400.0
    limits = KeyLimits("k", windows=(window("requests", 1e6, month), window("tokens", 1e7, month)))
    cost = estimate_cost(10.0)
    shared = await warm(disposable_redis.url)
    resilient = ResilientLimiter(shared, on_error="local", replica_id="r")
    assert (await resilient.acquire_key(KeyAsk(limits, "w", cost))).allowed  # asks alone
    assert (await resilient.acquire_key(KeyAsk(limits, "r0", cost))).allowed  # leases
    assert resilient.acquire_key_now(KeyAsk(limits, "r1", cost)) is not None
    tokens = shared._windows(limits)[1]
    with redis.Redis.from_url(disposable_redis.url, decode_responses=True) as c:
        before, debt = calls(disposable_redis.url), float(c.hget(tokens, "d"))
        # A refund the lease holds: settled at once, no storage call, the breaker untold.
        assert resilient.settle_soon(KeySettlement(limits, "r1", {"tokens": -5.0}))
        await asyncio.sleep(0.05)
        assert calls(disposable_redis.url) == before
        assert resilient.circuit is CircuitState.CLOSED
        # More than the lease holds: the lease takes what it has room for, the rest
        # reaches the storage in one call.
        assert resilient.settle_soon(KeySettlement(limits, "r0", {"tokens": 1e5}))
        for _ in range(100):
            if calls(disposable_redis.url) > before:
                break
            await asyncio.sleep(0.02)
        assert calls(disposable_redis.url) == before + 1
        risen = float(c.hget(tokens, "d")) - debt
    # The lease's part (its room: at most its first size's estimates and the refund) is
    # not charged again.
    room = FIRST_REQUESTS * cost["tokens"] + 5.0
    assert 1e5 - room - 1.0 < risen < 1e5 - 1.0
    await resilient.aclose()


async def test_a_deployment_lease_answers_a_reservation_at_once_while_the_storage_is_trusted(
    disposable_redis: RedisServer,
) -> None:
    resilient = quick_to_open(disposable_redis.url)
    ask = GroupAsk("g", [DEP], estimate_cost(0), max_wait=0.0, slot="r0")
    assert resilient.reserve_now(ask) is None  # no lease yet: await reserve
    assert (await resilient.reserve(ask)).deployment_id == DEP.id  # which takes one
    before = calls(disposable_redis.url)
    verdict = resilient.reserve_now(replace(ask, slot="r1"))
    assert verdict is not None and verdict.deployment_id == DEP.id
    assert verdict.sent is not None and verdict.sent.private.lease
    assert calls(disposable_redis.url) == before  # from the lease: no Redis call
    disposable_redis.kill()
    # A call that needs the storage fails: the breaker opens, the lease answers no more.
    await resilient.acquire_key(KeyAsk(DAILY, "k", estimate_cost(0)))
    assert resilient.circuit is CircuitState.OPEN
    assert resilient.reserve_now(replace(ask, slot="r2")) is None
    await resilient.aclose()
