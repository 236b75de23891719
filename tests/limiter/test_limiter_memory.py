"""What is specific to the in-memory backend: bounded memory."""

from __future__ import annotations

import pytest

from proxy.limiter.base import CooldownRule, DeploymentLimits, KeyLimits, Outcome, Rate
from proxy.limiter.memory import SWEEP_EVERY, MemoryLimiter
from proxy.limiter.verdicts import IN_FLIGHT_MARGIN, LEASE_TTL
from proxy.routing.health import FORGET_AFTER, HEALTHY


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_refilled_buckets_and_expired_leases_are_forgotten() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    keys = [KeyLimits(f"k{i}", rpm=Rate(60, 60, 60), max_parallel=2) for i in range(100)]
    for key in keys:
        assert (await limiter.acquire_key(key, "never-released", 1)).allowed
    dep = DeploymentLimits("d", rpm=Rate(60, 60, 1))
    await limiter.reserve_deployment("g", [dep], 1, max_wait=0)
    assert limiter.bucket_count() == 101
    assert limiter.leases_held("k0") == 1

    clock.now += SWEEP_EVERY  # everything has refilled; the next call sweeps
    await limiter.reserve_deployment("g", [dep], 1, max_wait=0)
    assert limiter.bucket_count() == 1  # only the bucket just charged
    assert limiter.leases_held("k0") == 1  # leases live for LEASE_TTL

    clock.now += LEASE_TTL + SWEEP_EVERY
    await limiter.correct_deployment("g", dep, 0, 0)
    assert limiter.bucket_count() == 0
    assert limiter.leases_held("k0") == 0


async def test_a_bucket_in_debt_is_kept() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    slow = DeploymentLimits("slow", rpm=Rate(1, 3600, 1))  # one an hour
    await limiter.reserve_deployment("g", [slow], 0, max_wait=0)
    clock.now += SWEEP_EVERY
    verdict = await limiter.reserve_deployment("g", [slow], 0, max_wait=0)
    assert verdict.deployment_id is None  # the debt survived the sweep
    assert verdict.retry_after == pytest.approx(3600 - SWEEP_EVERY)


async def test_health_and_in_flight_leases_are_forgotten_when_they_no_longer_matter() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    rule = CooldownRule(allowed_fails=3, window=60.0, time=30.0)
    dep = DeploymentLimits("d", probe_timeout=10.0)
    await limiter.reserve_deployment(
        "g", [dep], 0, max_wait=0, lease_id="never-settled", least_busy=True
    )
    await limiter.settle_deployment(
        "g", dep, lease_id="", outcome=Outcome("failure", "auth", cool_for=5.0), rule=rule
    )
    assert limiter.in_flight("g", "d") == 1
    clock.now += 10.0 + IN_FLIGHT_MARGIN + SWEEP_EVERY
    await limiter.deployment_health("g", ["d"])  # sweeps
    assert limiter.in_flight("g", "d") == 0 and not limiter.holds_in_flight(
        "g", "d", "never-settled"
    )
    assert limiter.health_of("g", "d").cooling  # a cooled deployment is kept...
    clock.now = 5.0 + FORGET_AFTER
    await limiter.deployment_health("g", ["d"])
    assert limiter.health_of("g", "d") == HEALTHY  # ...until it is forgotten
    assert limiter.bucket_count() == 0
