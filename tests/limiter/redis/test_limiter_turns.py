"""Turn leases in the Redis backend (leases.py, lua/turns.lua, lease_turns, return_turns)
on a real redis-server: the scripts compute what turns.py does, bit for bit; two replicas
taking leased turns of one paced deployment never grant two turns closer than its
interval; far from its limit a replica asks Redis once per lease, not per request."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.limits import patient, window

from loadtest.redis_calls import script_calls as calls
from proxy.costs import estimate_cost
from proxy.limiter.base import (
    CooldownRule,
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    Outcome,
    Rate,
)
from proxy.limiter.core import turns
from proxy.limiter.core.bucket import Bucket, BucketState, debt_at
from proxy.limiter.redis import scripts
from proxy.limiter.redis.backend import RedisLimiter

RULE = CooldownRule(allowed_fails=1, window=60.0, time=30.0)
# burst 1: a turn every 100 us, the default config's pacing at a high rate
PACED = DeploymentLimits("paced", windows=(window("requests", 600_000.0, 60.0, 1.0),))
INTERVAL = 60.0 / 600_000.0


rates = st.sampled_from(
    [
        Rate(600_000.0, 60.0, 1.0),
        Rate(6e6, 60.0, 1.0),
        Rate(6e7, 60.0, 1.0, ceiling=6e7),
        Rate(60_000.0, 60.0, 10.0),
        Rate(50_000.0, 86400.0, 50_000.0),
    ]
)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    windows=st.lists(
        st.tuples(rates, st.floats(0.0, 80.0), st.sampled_from([1.0, 30.0])), min_size=1, max_size=3
    ),
    elapsed=st.floats(0.0, 0.01),
    size=st.sampled_from([1, 2, 8, 64, 512]),
    waiting=st.booleans(),
)
def test_lua_turn_leases_match_the_pure_core(
    redis_url: str,
    windows: list[tuple[Rate, float, float]],
    elapsed: float,
    size: int,
    waiting: bool,
) -> None:
    """lease_turns mirrors turns.lease_turns and turns.grants: the same turns, the same
    charge, bit for bit; nobody waiting for a fair share is a condition."""
    now = 100.0 + elapsed
    keys = [f"w{i}" for i in range(len(windows))]
    args = [repr(now), str(size)]
    buckets, bounds = [], []
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("h", "waiting", *keys)
        if waiting:
            c.hset("waiting", "k", f"0 1 {now + 1.0!r}")
        for key, (rate, debt, cost) in zip(keys, windows, strict=True):
            c.hset(key, mapping={"d": repr(debt), "t": "100.0"})
            state = BucketState(debt, 100.0)
            capacity = rate.capacity_for(cost)
            long = 0.0 if rate.period <= turns.LONG else rate.capacity
            args += [repr(rate.interval), repr(capacity), repr(cost), repr(long)]
            buckets.append(Bucket(state, rate, cost))
            bounds.append(turns.bound(rate, debt_at(state, rate.interval, now)))
        reply = c.eval(scripts.source("lease_turns"), 2 + len(keys), "h", "waiting", *keys, *args)
        after, taken, first, last = turns.lease_turns(buckets, size, bounds, now)
        if waiting or not turns.grants(first, taken):
            # Refused for its turns ahead, it says how far they reach (turns.refused_for).
            assert reply[0] == "0"
            assert [float(x) for x in reply[1:]] == ([] if waiting else [first])
            assert [c.hget(k, "d") for k in keys] == [repr(d) for _, d, _ in windows]
            return
        assert reply[0] == "1" and float(reply[1]) == now
        assert (int(reply[4]), float(reply[5]), float(reply[6])) == (taken, first, last)
        # Numbered in a fresh health period: as many as it is expected to hand out.
        assert reply[3] == "1" and int(c.hget("h", "n") or 0) == turns.counted(taken)
        debts = [float(x) for x in reply[7:]]
        before = [debt_at(b.state, b.rate.interval, now) for b in buckets]
        assert debts[::2] == before
        assert debts[1::2] == [s.debt for s in after]
        assert [float(c.hget(k, "d")) for k in keys] == [s.debt for s in after]
        # No settlement's refund takes a bucket below the lease's turns (its floor).
        assert [float(c.hget(k, "fd")) for k in keys] == [s.debt for s in after]


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(touched=st.booleans(), used=st.floats(0.0, 8.0), later=st.floats(0.0, 0.01))
def test_lua_give_backs_match_the_pure_core(
    redis_url: str, touched: bool, used: float, later: float
) -> None:
    """return_turns mirrors turns.returned: the local bucket, only where the lease's
    charge is still what the bucket holds."""
    end = BucketState(8.0, 100.0)
    stored = BucketState(9.0, 100.001) if touched else end
    local = BucketState(used, 100.0 + later)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete("w")
        c.hset("w", mapping={"d": repr(stored.debt), "t": repr(stored.at)})
        args = [repr(end.at), repr(INTERVAL), repr(end.debt), repr(local.debt), repr(local.at)]
        c.eval(scripts.source("return_turns"), 1, "w", *args)
        expected = turns.returned(stored, end, local) or stored
        assert (float(c.hget("w", "d")), float(c.hget("w", "t"))) == (expected.debt, expected.at)


def apart(times: list[float]) -> bool:
    """Whether turns on Redis's clock are at least the interval apart, but for rounding:
    a time near 1.8e9 seconds is a double, 2.4e-7 s from the next (each of two turns a
    few additions away from exact)."""
    ordered = sorted(times)
    return all(b - a >= INTERVAL - 4 * math.ulp(b) for a, b in itertools.pairwise(ordered))


def turn_time(verdict: DeploymentVerdict) -> float:
    """The turn a verdict granted, on Redis's clock."""
    assert verdict.sent is not None
    return verdict.sent.at


async def take_turn(lim: RedisLimiter, ask: GroupAsk) -> DeploymentVerdict:
    """As the dispatcher asks: the open lease at once, else the turn of the renewal on
    its way, else the awaited way."""
    verdict = lim.reserve_now(ask)
    if verdict is None:
        renewal = lim.reserve_on_renewal(ask)
        verdict = None if renewal is None else await renewal
    return verdict or await lim.reserve(ask)


async def test_two_replicas_never_grant_turns_closer_than_the_pacing(redis_url: str) -> None:
    """Both replicas' turns, leased and per request, in one timeline: at least the
    interval apart (the granted times; each is sent no sooner than its time, and up to
    the late-turns margin later: docs/limiter.md)."""
    replicas = [patient(redis_url, lease_warm_uses=0), patient(redis_url, lease_warm_uses=0)]
    granted: list[float] = []
    leased = [0, 0]

    async def client(lim: RedisLimiter, name: str) -> None:
        for i in range(60):
            slot = f"{name}-{i}"
            ask = GroupAsk("g", [PACED], estimate_cost(0), 5.0, slot)
            verdict = await take_turn(lim, ask)
            granted.append(turn_time(verdict))
            assert verdict.sent is not None
            leased[replicas.index(lim)] += bool(verdict.sent.private.lease)
            if i % 7 == 0:  # some requests take longer: the demand varies
                await asyncio.sleep(0.002)
            await lim.settle(DeploymentSettlement("g", PACED, RULE, slot=slot, sent=verdict.sent))

    await asyncio.gather(
        *(client(lim, f"{n}-{c}") for n, lim in enumerate(replicas) for c in range(4))
    )
    for lim in replicas:
        await lim.aclose()
    # Leased turns and per-request ones (a replica beside another's lease, or whose lease
    # said the demand came near the limit, asks per request), in one timeline.
    assert 0 < sum(leased) < len(granted)
    assert apart(granted)


async def test_far_from_its_limit_a_paced_deployment_asks_once_per_lease(redis_url: str) -> None:
    lim = patient(redis_url, lease_warm_uses=0)
    await lim.reserve(GroupAsk("g", [PACED], estimate_cost(0), 5.0, "warm"))
    before = calls(redis_url)
    verdicts = await asyncio.gather(
        *(lim.reserve(GroupAsk("g", [PACED], estimate_cost(0), 5.0, f"r{i}")) for i in range(6))
    )
    assert calls(redis_url) - before <= 2  # one lease (and a give-back riding along)
    assert apart([turn_time(v) for v in verdicts])
    await lim.aclose()


async def test_an_open_turn_lease_hands_out_turns_without_an_await(redis_url: str) -> None:
    """``reserve_now`` takes the next turn of the open lease, exactly as ``reserve``
    would, and no Redis call; with no lease open it answers nothing (await ``reserve``).
    (A busy machine can outlast a lease's span between two steps: then again.)"""
    lim = patient(redis_url, lease_warm_uses=0)
    assert lim.reserve_now(GroupAsk("g", [PACED], estimate_cost(0), 5.0, "cold")) is None
    leased: list[DeploymentVerdict] = []
    for attempt in range(50):
        first = await lim.reserve(GroupAsk("g", [PACED], estimate_cost(0), 5.0, f"f{attempt}"))
        assert first.sent is not None
        if not first.sent.private.lease:
            continue  # per request this time (a first grant that came slowly, say)
        before = calls(redis_url)
        asked = [GroupAsk("g", [PACED], estimate_cost(0), 5.0, f"r{attempt}-{i}") for i in range(4)]
        leased = [v for v in map(lim.reserve_now, asked) if v is not None]
        assert calls(redis_url) == before
        if leased:
            break
    assert leased and all(v.sent is not None and v.sent.private.lease for v in leased)
    assert apart([turn_time(v) for v in [first, *leased]])
    await lim.aclose()


async def test_requests_waiting_for_a_renewal_are_served_as_it_is_read(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy event loop resumes the requests that waited for a turn lease long after
    its grant was read, past the lease's last turn: they hold their turns from the
    moment it was read, so one lease serves them all (not a renewal each, then a
    round trip each)."""
    lim = patient(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [PACED], estimate_cost(0), 5.0, "warm")
    await lim.reserve(ask)  # connected, the storage's clock placed
    real_run = lim.runner.run

    async def busy_after_grant(name: str, keys: list[str], args: list[str]) -> Any:
        reply = await real_run(name, keys, args)
        if name == "lease_turns":  # the loop busy before any waiter resumes
            asyncio.get_running_loop().call_soon(time.sleep, 4 * turns.SPAN)
        return reply

    monkeypatch.setattr(lim.runner, "run", busy_after_grant)
    await asyncio.sleep(10 * turns.SPAN)  # idle: the warm-up's lease, if any, given back
    before = calls(redis_url)
    verdicts = await asyncio.gather(
        *(lim.reserve(GroupAsk("g", [PACED], estimate_cost(0), 5.0, f"r{i}")) for i in range(8))
    )
    assert all(v.sent is not None and v.sent.private.lease for v in verdicts)
    assert calls(redis_url) - before <= 2  # one lease (and the old one's give-back)
    assert apart([turn_time(v) for v in verdicts])
    await lim.aclose()


async def test_requests_finding_their_lease_renewed_take_its_turns_with_no_call(
    redis_url: str,
) -> None:
    """``reserve_on_renewal``: a request that finds its deployment's turn lease being
    renewed (by another request) takes its turn from that renewal as it is read, with no
    call of its own; with no renewal on its way it answers nothing (await ``reserve``).
    (Whether a renewal is caught on its way depends on the machine: tried again.)"""
    lim = patient(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [PACED], estimate_cost(0), 5.0, "warm")
    await lim.reserve(ask)  # connected, the storage's clock placed, the costs known paced
    assert lim.reserve_on_renewal(ask) is None  # nothing on its way
    served: list[DeploymentVerdict] = []
    for attempt in range(50):
        # Idle past a refusal's wait: the next request renews the lease.
        await asyncio.sleep(turns.REFUSED_FOR + 10 * turns.SPAN)
        before = calls(redis_url)
        renewing = asyncio.ensure_future(take_turn(lim, replace(ask, slot=f"first{attempt}")))
        renewals: list[Awaitable[DeploymentVerdict | None]] = []
        for _ in range(20):  # until the renewal is on its way (a step of the request's)
            await asyncio.sleep(0)
            renewal = lim.reserve_on_renewal(replace(ask, slot=f"w{attempt}-0"))
            if renewal is not None:
                renewals.append(renewal)
                break
        if not renewals:
            await renewing
            continue
        for i in range(1, 5):
            renewal = lim.reserve_on_renewal(replace(ask, slot=f"w{attempt}-{i}"))
            assert renewal is not None  # the same renewal, still on its way
            renewals.append(renewal)
        first = await renewing
        got = [await r for r in renewals]
        if not all(v is not None and v.sent is not None and v.sent.private.lease for v in got):
            continue  # the renewal brought no lease (refused, or read too late to trust)
        assert calls(redis_url) - before <= 2  # the renewal (and a give-back): theirs, none
        served = [v for v in got if v is not None]
        assert apart([turn_time(v) for v in [first, *served]])
        break
    assert served
    await lim.aclose()


async def test_a_failure_on_a_leased_turn_closes_the_lease(redis_url: str) -> None:
    lim = patient(redis_url, lease_warm_uses=0)
    ask = GroupAsk("g", [PACED], estimate_cost(0), 5.0, "r")
    await lim.reserve(ask)  # connected: a first grant that came slowly is not trusted
    verdict = await lim.reserve(ask)
    assert verdict.sent is not None and verdict.sent.private.lease
    failure = Outcome("failure", "server_error")
    await lim.settle(DeploymentSettlement("g", PACED, RULE, failure, "r", sent=verdict.sent))
    after = await lim.reserve(ask)
    assert after.deployment_id is None and after.cooling
    await lim.aclose()


async def test_a_group_with_waiting_keys_is_served_one_turn_at_a_time(redis_url: str) -> None:
    lim = patient(redis_url, lease_warm_uses=0)
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        (now, _) = c.time()
        c.hset(f"{{{lim.prefix}:g:g}}:fair:waiting", "other", f"0 1 {now + 60}")
    verdict = await lim.reserve(GroupAsk("g", [PACED], estimate_cost(0), 5.0, "r"))
    assert verdict.sent is not None and not verdict.sent.private.lease
    await lim.aclose()
