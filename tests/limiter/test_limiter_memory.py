"""What is specific to the in-memory backend: bounded memory."""

from __future__ import annotations

import pytest
from support.limits import RULE, Clock, rpm

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    GroupAsk,
    KeyAsk,
    KeyLimits,
    Outcome,
    Rate,
    Window,
)
from proxy.limiter.core.health import FORGET_AFTER, HEALTHY
from proxy.limiter.core.verdicts import IN_FLIGHT_MARGIN, LEASE_TTL
from proxy.limiter.memory import SWEEP_EVERY, MemoryLimiter


async def test_refilled_buckets_and_expired_leases_are_forgotten() -> None:
    clock = Clock(0.0)
    limiter = MemoryLimiter(clock)
    keys = [KeyLimits(f"k{i}", windows=(rpm(60, 60),), max_parallel=2) for i in range(100)]
    for key in keys:
        assert (await limiter.acquire_key(KeyAsk(key, "never-released", estimate_cost(1)))).allowed
    dep = DeploymentLimits("d", windows=(rpm(60, 1),))
    await limiter.reserve(GroupAsk("g", [dep], estimate_cost(1), max_wait=0))
    assert limiter.bucket_count() == 101
    assert limiter.leases_held("k0") == 1

    clock.now += SWEEP_EVERY  # everything has refilled; the next call sweeps
    await limiter.reserve(GroupAsk("g", [dep], estimate_cost(1), max_wait=0))
    assert limiter.bucket_count() == 1  # only the bucket just charged
    assert limiter.leases_held("k0") == 1  # leases live for LEASE_TTL

    clock.now += LEASE_TTL + SWEEP_EVERY
    await limiter.settle(DeploymentSettlement("g", dep, RULE, cost={}))
    assert limiter.bucket_count() == 0
    assert limiter.leases_held("k0") == 0


async def test_a_bucket_in_debt_is_kept() -> None:
    clock = Clock(0.0)
    limiter = MemoryLimiter(clock)
    slow = DeploymentLimits(
        "slow", windows=(Window("rpm", "requests", Rate(1, 3600, 1)),)
    )  # one an hour
    await limiter.reserve(GroupAsk("g", [slow], estimate_cost(0), max_wait=0))
    clock.now += SWEEP_EVERY
    verdict = await limiter.reserve(GroupAsk("g", [slow], estimate_cost(0), max_wait=0))
    assert verdict.deployment_id is None  # the debt survived the sweep
    assert verdict.retry_after == pytest.approx(3600 - SWEEP_EVERY)


async def test_health_and_in_flight_leases_are_forgotten_when_they_no_longer_matter() -> None:
    clock = Clock(0.0)
    limiter = MemoryLimiter(clock)
    dep = DeploymentLimits("d", probe_timeout=10.0)
    await limiter.reserve(
        GroupAsk("g", [dep], estimate_cost(0), max_wait=0, slot="never-settled", least_busy=True)
    )
    await limiter.settle(
        DeploymentSettlement(
            "g", dep, slot="", outcome=Outcome("failure", "auth", cool_for=5.0), rule=RULE
        )
    )
    assert limiter.in_flight("g", "d") == 1
    clock.now += 10.0 + IN_FLIGHT_MARGIN + SWEEP_EVERY
    await limiter.snapshot("g", [dep])  # sweeps
    assert limiter.in_flight("g", "d") == 0 and not limiter.holds_in_flight(
        "g", "d", "never-settled"
    )
    assert limiter.health_of("g", "d").cooling  # a cooled deployment is kept...
    clock.now = 5.0 + FORGET_AFTER
    await limiter.snapshot("g", [dep])
    assert limiter.health_of("g", "d") == HEALTHY  # ...until it is forgotten
    assert limiter.bucket_count() == 0
