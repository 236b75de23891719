"""ONE table of bucket cases, run against the pure core, the memory backend (injected
clock), the Lua scripts on a single Redis and on a Redis Cluster (explicit ``now``).

Each case is (description, rate, steps, expected): a step is (time, op, cost, max_wait);
``take`` expects ("go", wait), ("refused", retry_after) or ("too_large", 0); ``adjust``
(a correction of ``cost`` units, negative refunds) expects None. The backends are driven
through one bucket each: a deployment whose only limit is ``rate`` (tpm), so ``cost`` is
its tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import pytest
from support.limits import RULE, patient

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    Limiter,
    Rate,
    Window,
)
from proxy.limiter.core import bucket
from proxy.limiter.memory import MemoryLimiter

Result = tuple[str, float] | None


@dataclass(frozen=True)
class Step:
    at: float
    op: str  # "take" | "adjust"
    cost: float
    max_wait: float = 0.0


def take(at: float, cost: float = 1.0, max_wait: float = 0.0) -> Step:
    return Step(at, "take", cost, max_wait)


def adjust(at: float, units: float) -> Step:
    return Step(at, "adjust", units)


GO0 = ("go", 0.0)


def burst_of(n: int, at: float = 0.0) -> list[Step]:
    return [take(at) for _ in range(n)]


CASES: list[tuple[str, Rate, list[Step], list[Result]]] = [
    (
        "a full bucket passes `capacity` requests at once, then refuses",
        Rate(3, 3, 3),
        [*burst_of(3), take(0)],
        [GO0, GO0, GO0, ("refused", 1.0)],
    ),
    (
        "a key limited to 50 RPM may send 50 at once, then one per 1.2 s",
        Rate(50, 60, 50),
        [*burst_of(50, at=1000.0), take(1000.0), take(1001.2), take(1001.2)],
        [*[GO0] * 50, ("refused", 1.2), GO0, ("refused", 1.2)],
    ),
    (
        "one unit refills per interval, never beyond capacity",
        Rate(1, 1, 2),
        [take(0, 2), take(1), take(1), take(100, 2), take(100)],
        [GO0, GO0, ("refused", 1.0), GO0, ("refused", 1.0)],
    ),
    (
        "a refused request charges nothing",
        Rate(1, 1, 1),
        [take(0), take(0), take(0.5), take(1)],
        [GO0, ("refused", 1.0), ("refused", 0.5), GO0],
    ),
    (
        "a cost above capacity is too large, even with a long max_wait, and charges nothing",
        Rate(10, 10, 5),
        [take(0, 6), take(0, 6, max_wait=100), take(0, 5)],
        [("too_large", 0.0), ("too_large", 0.0), GO0],
    ),
    (
        "a cost equal to capacity passes on a full bucket",
        Rate(7, 60, 7),
        [take(0, 7), take(0, 7, max_wait=60)],
        [GO0, ("go", 60.0)],
    ),
    (
        "fractional costs (tokens)",
        Rate(10, 10, 2),
        [take(0, 0.5), take(0, 0.5), take(0, 0.25), take(0, 0.75), take(0, 0.5)],
        [GO0, GO0, GO0, GO0, ("refused", 0.5)],
    ),
    (
        "turns are reserved exactly one interval apart within max_wait",
        Rate(60, 60, 1),
        [take(0, 1, 10), take(0, 1, 10), take(0, 1, 10), take(0, 1, 10)],
        [GO0, ("go", 1.0), ("go", 2.0), ("go", 3.0)],
    ),
    (
        "beyond max_wait: refused until a reservation fits; retrying then succeeds",
        Rate(1, 1, 1),
        [take(0), take(0, 1, 5), take(0, 1, 5), take(0, 1, 1.5), take(1.5, 1, 1.5)],
        [GO0, ("go", 1.0), ("go", 2.0), ("refused", 1.5), ("go", 1.5)],
    ),
    (
        "max_wait 0 refuses with the time until it could go at once",
        Rate(2, 1, 1),
        [take(0), take(0.1), take(0.5)],
        [GO0, ("refused", 0.4), GO0],
    ),
    (
        "giving back a reserved turn shortens the queue",
        Rate(1, 1, 1),
        [take(0), take(0, 1, 10), take(0, 1, 10), adjust(0, -1), take(0, 1, 10)],
        [GO0, ("go", 1.0), ("go", 2.0), None, ("go", 2.0)],
    ),
    (
        "a refund never makes the bucket fuller than full",
        Rate(2, 2, 2),
        [take(0, 2), adjust(0, -1), take(0), adjust(0, -10), take(0, 2), take(0)],
        [GO0, None, GO0, None, GO0, ("refused", 1.0)],
    ),
    (
        "an underestimate (positive correction) pushes the debt past capacity",
        Rate(1, 1, 2),
        [take(0), adjust(0, 3), take(0), take(3)],
        [GO0, None, ("refused", 3.0), GO0],
    ),
    (
        "a correction is applied to the refilled bucket, not the stale one",
        Rate(1, 1, 3),
        [take(0, 3), adjust(10, 2), take(10, 1), take(10)],
        [GO0, None, GO0, ("refused", 1.0)],
    ),
    (
        "a clock stepping back keeps the TAT (drains nothing, gives nothing)",
        Rate(1, 1, 1),
        [take(5), take(4), take(6)],
        [GO0, ("refused", 2.0), GO0],
    ),
    (
        "a long-idle bucket is full (expired state reads as full)",
        Rate(100, 1, 5),
        [take(0, 5), take(1e6, 5), take(1e6)],
        [GO0, GO0, ("refused", 0.01)],
    ),
]


class BucketDriver(Protocol):
    async def take(self, at: float, cost: float, max_wait: float) -> Result: ...
    async def adjust(self, at: float, units: float) -> None: ...


class PureDriver:
    def __init__(self, rate: Rate) -> None:
        self.rate = rate
        self.state = bucket.FULL

    async def take(self, at: float, cost: float, max_wait: float) -> Result:
        self.state, decision = bucket.take(self.state, self.rate, cost, at, max_wait)
        if decision.admission is bucket.Admission.ALLOWED:
            return ("go", decision.wait)
        if decision.admission is bucket.Admission.REFUSED:
            return ("refused", decision.retry_after)
        return ("too_large", 0.0)

    async def adjust(self, at: float, units: float) -> None:
        self.state = bucket.adjust(self.state, self.rate, units, at)


class LimiterDriver:
    """One bucket through a Limiter: a deployment limited only by ``rate`` (tpm)."""

    def __init__(self, make: Callable[[Callable[[], float]], Limiter], rate: Rate) -> None:
        self.now = 0.0
        self.limiter = make(lambda: self.now)
        self.deployment = DeploymentLimits("d", windows=(Window("tpm", "tokens", rate),))

    async def take(self, at: float, cost: float, max_wait: float) -> Result:
        self.now = at
        verdict = await self.limiter.reserve(
            GroupAsk("g", [self.deployment], estimate_cost(cost), max_wait)
        )
        return _result(verdict)

    async def adjust(self, at: float, units: float) -> None:
        self.now = at
        await self.limiter.settle(
            DeploymentSettlement("g", self.deployment, RULE, cost={"tokens": units})
        )


def _result(verdict: DeploymentVerdict) -> Result:
    if verdict.deployment_id is not None:
        return ("go", verdict.wait)
    if verdict.code == "request_too_large":
        return ("too_large", 0.0)
    assert verdict.code == "model_capacity"
    return ("refused", verdict.retry_after)


BACKENDS = ["pure", "memory", "redis", "redis-cluster"]


@pytest.fixture(params=BACKENDS)
async def driver_factory(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[[Rate], BucketDriver]]:
    backend: str = request.param
    limiters: list[Limiter] = []

    def make(rate: Rate) -> BucketDriver:
        if backend == "pure":
            return PureDriver(rate)
        if backend == "memory":
            driver = LimiterDriver(lambda clock: MemoryLimiter(clock), rate)
        else:
            fixture = "redis_url" if backend == "redis" else "redis_cluster_url"
            url: str = request.getfixturevalue(fixture)
            driver = LimiterDriver(lambda clock: patient(url, clock=clock), rate)
        limiters.append(driver.limiter)
        return driver

    yield make
    for limiter in limiters:
        await limiter.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("description", "rate", "steps", "expected"), CASES, ids=[c[0] for c in CASES]
)
async def test_bucket_case(
    driver_factory: Callable[[Rate], BucketDriver],
    description: str,
    rate: Rate,
    steps: list[Step],
    expected: list[Result],
) -> None:
    assert len(steps) == len(expected), description
    driver = driver_factory(rate)
    results: list[Result] = []
    for step in steps:
        if step.op == "take":
            results.append(await driver.take(step.at, step.cost, step.max_wait))
        else:
            await driver.adjust(step.at, step.cost)
            results.append(None)
    assert results == [_approx(e) for e in expected], description


def _approx(expected: Result) -> object:
    # Hand-written expectations vs float arithmetic (1.2 * n); backends are compared
    # with each other exactly in the property tests.
    if expected is None:
        return None
    return (expected[0], pytest.approx(expected[1], rel=1e-9, abs=1e-9))
