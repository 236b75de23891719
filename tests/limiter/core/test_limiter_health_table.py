"""ONE table of deployment-health cases, run against the memory backend (injected clock)
and the Lua scripts on a single Redis and on a Redis Cluster (explicit ``now``).

Each case is (description, steps); every step carries what it must answer:

* ``Reserve(at, "ab", expect, ...)``: candidates by letter, in preference order; expects
  ``Go(deployment, wait, probe)``, ``Refused(retry_after, cooling)`` or ``TOO_LARGE``;
* ``Settle(at, "a", outcome, expect, ...)``: expects the ``HealthChange``;
* ``Sync(at, "a", ...)``: the upstream's remaining budget (answers nothing);
* ``Health(at, {"a": seconds, ...})``: ``snapshot``'s ``unusable_for``.

The cooldown rule is 3 failures within 60 s cool for 30 s; probes may be out 10 s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from support.limits import RULE, patient, rpm, tpm

from proxy.costs import estimate_cost
from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    Limiter,
    Outcome,
    Remaining,
    Sent,
)
from proxy.limiter.core.health import FORGET_AFTER, GROWTH, MARGIN
from proxy.limiter.core.verdicts import IN_FLIGHT_MARGIN
from proxy.limiter.memory import MemoryLimiter

PROBE = 10.0  # every deployment's probe_timeout

DEPLOYMENTS = {
    # one request a second, no burst
    "a": DeploymentLimits("a", windows=(rpm(60, 1),), probe_timeout=PROBE),
    "b": DeploymentLimits("b", windows=(rpm(60, 1),), probe_timeout=PROBE),
    # roomy: ten at once
    "x": DeploymentLimits("x", windows=(rpm(600, 10),), probe_timeout=PROBE),
    "y": DeploymentLimits("y", windows=(rpm(600, 10),), probe_timeout=PROBE),
    # requests and tokens: 10 at once then 1/s; 1000 tokens at once then 100/s
    "t": DeploymentLimits(
        "t",
        windows=(
            rpm(60, 10),
            tpm(6000, 1000),
        ),
        probe_timeout=PROBE,
    ),
    # at most 100 tokens per request
    "s": DeploymentLimits("s", windows=(tpm(600, 100),), probe_timeout=PROBE),
}

OK = Outcome("success")
FAIL = Outcome("failure", "server_error")
NEUTRAL = Outcome("neutral")


def cool(seconds: float, rate_limited: bool = False) -> Outcome:
    reason = "rate_limited" if rate_limited else "auth"
    return Outcome("failure", reason, cool_for=seconds, rate_limited=rate_limited)


@dataclass(frozen=True)
class Go:
    deployment: str
    wait: float = 0.0
    probe: bool = False


@dataclass(frozen=True)
class Refused:
    retry_after: float
    cooling: bool = False


TOO_LARGE = "too_large"
Expect = Go | Refused | str


@dataclass(frozen=True)
class Reserve:
    at: float
    ids: str
    expect: Expect
    tokens: float = 0.0
    max_wait: float = 0.0
    lease: str = ""
    least_busy: bool = False


@dataclass(frozen=True)
class Settle:
    at: float
    id: str
    outcome: Outcome
    expect: HealthChange = field(default_factory=HealthChange)
    lease: str = ""
    requests: float = 0.0
    tokens: float = 0.0
    sent: Sent | None = None


@dataclass(frozen=True)
class Sync:
    at: float
    id: str
    remaining_requests: float | None = None
    reset_requests: float | None = None
    remaining_tokens: float | None = None


@dataclass(frozen=True)
class Health:
    at: float
    expect: dict[str, float]


Step = Reserve | Settle | Sync | Health


def fails(*times: float) -> list[Step]:
    return [Settle(t, "a", FAIL) for t in times]


def cooled(seconds: float) -> HealthChange:
    return HealthChange(cooled=True, cool_for=seconds)


RECOVERED = HealthChange(recovered=True)
LEARNED = HealthChange(cooled=True, cool_for=3.0, epoch=1)
# The rate in force 2.2 s after that lesson's hold ended: MARGIN * 3 / 6, grown since.
SECOND_RATE = MARGIN * 3 / 6 * (1 + GROWTH * 2.2)

CASES: list[tuple[str, list[Step]]] = [
    (
        "allowed_fails failures within the window cool the deployment",
        [
            *fails(0, 10),
            Settle(20, "a", FAIL, cooled(30)),
            Reserve(20, "a", Refused(30, cooling=True), max_wait=5),
            Health(20, {"a": 30, "b": 0}),
            Health(45, {"a": 5}),
        ],
    ),
    (
        "failures older than the window do not count",
        [*fails(0, 1, 61.5), Reserve(61.5, "a", Go("a")), Health(61.5, {"a": 0})],
    ),
    (
        "a failure exactly one window old no longer counts",
        [*fails(0, 1, 60), Reserve(60, "a", Go("a")), Settle(60.5, "a", FAIL, cooled(30))],
    ),
    (
        "a cooling deployment is never reserved, not even for a turn after its cooldown",
        [
            Settle(0, "a", cool(30), cooled(30)),
            Reserve(1, "ab", Go("b")),
            Reserve(1, "ab", Go("b", 1.0), max_wait=5),  # a could go now, b waits
            Reserve(29.5, "a", Refused(0.5, cooling=True), max_wait=5),
        ],
    ),
    (
        "after the cooldown exactly one reservation goes: the probe",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Reserve(5, "a", Go("a", probe=True), lease="p"),
            Reserve(6, "a", Refused(9, cooling=True), max_wait=30),  # until 5 + 10
            Health(6, {"a": 9}),
            Reserve(6, "ab", Go("b")),
        ],
    ),
    (
        "a successful probe recovers the deployment",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Reserve(5, "a", Go("a", probe=True), lease="p"),
            Settle(7, "a", OK, RECOVERED, lease="p"),
            Reserve(7, "a", Go("a")),
            Settle(7, "a", OK),  # healthy: nothing to recover
            Health(7, {"a": 0}),
        ],
    ),
    (
        "a failed probe, or a failure while cooling, cools again (extended, never shortened)",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Settle(2, "a", FAIL, cooled(30)),  # a failure while cooling: 2 + 30
            Health(2, {"a": 30}),
            Reserve(32, "a", Go("a", probe=True), lease="p"),
            Settle(33, "a", FAIL, cooled(30), lease="p"),
            Reserve(62, "a", Refused(1, cooling=True)),
            Reserve(63, "a", Go("a", probe=True)),
        ],
    ),
    (
        "a probe nobody answers frees the slot at its deadline",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Reserve(5, "a", Go("a", probe=True)),
            Reserve(14.5, "a", Refused(0.5, cooling=True)),
            Reserve(15, "a", Go("a", probe=True)),
        ],
    ),
    (
        "an abandoned probe frees the slot at once; another request's does not",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Reserve(5, "a", Go("a", probe=True), lease="p"),
            Settle(6, "a", NEUTRAL, HealthChange(cool_for=9.0), lease="other", requests=-1),
            Reserve(6, "a", Refused(9, cooling=True)),
            Settle(6, "a", NEUTRAL, lease="p", requests=-1),
            Reserve(6, "a", Go("a", probe=True), lease="q"),
        ],
    ),
    (
        "a probe waiting for its turn is out until its turn plus probe_timeout",
        [
            Reserve(4.5, "a", Go("a")),  # the next turn is at 5.5
            Settle(4.5, "a", cool(0.5), cooled(0.5)),
            Reserve(5, "a", Go("a", 0.5, probe=True), max_wait=5),
            Health(5, {"a": 10.5}),
        ],
    ),
    (
        "an upstream 429 holds: turns from the end of the hold, paced, no probe",
        [
            Settle(0, "a", cool(2, rate_limited=True), cooled(2)),
            Health(1, {"a": 1.0}),
            Reserve(1, "a", Go("a", 1.0), max_wait=5),
            Reserve(1, "a", Go("a", 2.0), max_wait=5),
            # Held 1 s more, within max_wait: refused for its budget, at capacity (429)
            Reserve(1, "a", Refused(1.5, cooling=False), max_wait=1.5),
            # Held longer than max_wait: unavailable (503)
            Reserve(1, "a", Refused(2.5, cooling=True), max_wait=0.5),
            Settle(1, "b", cool(10, rate_limited=True), cooled(10)),
            Reserve(1, "b", Refused(5.0, cooling=True), max_wait=5),  # the hold binds
            Reserve(1, "ab", Go("a", 3.0), max_wait=5),
        ],
    ),
    (
        "a 429 learns the rate the upstream admitted; turns past its hold are dropped",
        [
            # Turns at 0, 1, 2, 3 (1/s); the 4th (sent at 3, epoch 0) got 429, retry in
            # 3 s: the upstream took 3 in 6 s.
            Reserve(0, "a", Go("a")),
            Reserve(0, "a", Go("a", 1.0), max_wait=10),
            Reserve(0, "a", Go("a", 2.0), max_wait=10),
            Reserve(0, "a", Go("a", 3.0), max_wait=10),
            Reserve(0, "a", Go("a", 4.0), max_wait=10),  # a 5th, queued
            Settle(3, "a", cool(3, rate_limited=True), LEARNED, sent=Sent(0, 4, 3.0)),
            # Held until 6, then at MARGIN * 3 / 6 a second; the 5th turn was dropped.
            Reserve(3, "a", Go("a", 3.0), max_wait=10),
            Reserve(3, "a", Go("a", 3.0 + 2 / MARGIN), max_wait=10),
            Health(3, {"a": 3.0}),
        ],
    ),
    (
        "a 429 while a learned rate is in force lowers it by MARGIN at most",
        [
            Reserve(0, "a", Go("a")),
            Reserve(0, "a", Go("a", 1.0), max_wait=10),
            Reserve(0, "a", Go("a", 2.0), max_wait=10),
            Reserve(0, "a", Go("a", 3.0), max_wait=10),
            Settle(3, "a", cool(3, rate_limited=True), LEARNED, sent=Sent(0, 4, 3.0)),
            # Learned MARGIN * 3 / 6 a second, held until 6: turns at 6 and 6 + 2 / MARGIN.
            Reserve(3, "a", Go("a", 3.0), max_wait=10),
            Reserve(3, "a", Go("a", 3.0 + 2 / MARGIN), max_wait=10),
            # The second turn of that period got 429, retry in 1 s: measured, 1 turn over
            # 2 / MARGIN + 1 s (far too low); it lowers the rate in force by MARGIN only.
            Settle(
                8.2,
                "a",
                cool(1, rate_limited=True),
                HealthChange(cooled=True, cool_for=1.0, epoch=2),
                sent=Sent(1, 2, 6 + 2 / MARGIN),
            ),
            Reserve(8.2, "a", Go("a", 1.0), max_wait=10),
            Reserve(8.2, "a", Go("a", 1.0 + 1 / (MARGIN * SECOND_RATE)), max_wait=10),
        ],
    ),
    (
        "least_busy: the fewest requests in flight across replicas, list order among equals",
        [
            Reserve(0, "xy", Go("x"), lease="1", least_busy=True),
            Reserve(0, "xy", Go("y"), lease="2", least_busy=True),
            Reserve(0, "xy", Go("x"), lease="3", least_busy=True),
            Reserve(0, "xy", Go("y"), lease="4", least_busy=True),
            Reserve(0, "xy", Go("x"), lease="5", least_busy=True),
            Reserve(0, "xy", Go("y"), least_busy=True),  # no lease: not counted
            Reserve(0, "xy", Go("y"), lease="6", least_busy=True),
            Settle(1, "x", OK, lease="1"),
            Settle(1, "x", OK, lease="3"),
            Reserve(1, "yx", Go("x"), least_busy=True),  # x: 1, y: 3
            Reserve(1, "yx", Go("y")),  # not least_busy: list order
        ],
    ),
    (
        "least_busy: going now beats fewer in flight",
        [
            Reserve(0, "a", Go("a")),  # a: no request in flight, next turn in 1 s
            Reserve(0, "x", Go("x"), lease="1"),
            Reserve(0, "ax", Go("x"), lease="2", least_busy=True, max_wait=5),
            Reserve(0, "ab", Go("b"), least_busy=True, max_wait=5),
            Reserve(0, "ab", Go("a", 1.0), least_busy=True, max_wait=5),  # none now: soonest
        ],
    ),
    (
        "in-flight leases never settled stop counting after their deadline",
        [
            Reserve(0, "xy", Go("x"), lease="1", least_busy=True),
            Reserve(0, "xy", Go("y"), lease="2", least_busy=True),
            Reserve(0, "xy", Go("x"), lease="3", least_busy=True),
            Reserve(50, "xy", Go("y"), lease="4", least_busy=True),  # x: 2, y: 1
            Reserve(PROBE + IN_FLIGHT_MARGIN + 1, "yx", Go("x"), least_busy=True),  # x: 0, y: 1
        ],
    ),
    (
        "sync_budget: tokens come down to what the upstream has left",
        [
            Sync(0, "t", remaining_tokens=100),
            Reserve(0, "t", Go("t"), tokens=100),
            Reserve(0, "t", Refused(0.01), tokens=1),  # 100 tokens a second
        ],
    ),
    (
        "sync_budget never raises a bucket, and None is unknown",
        [
            Reserve(0, "t", Go("t"), tokens=600),
            Sync(0, "t", remaining_requests=100, remaining_tokens=5000),
            Sync(0, "t"),
            Reserve(0, "t", Go("t"), tokens=400),
            Reserve(0, "t", Refused(0.01), tokens=1),
        ],
    ),
    (
        "sync_budget: no requests left means none before the upstream's reset",
        [
            Sync(0, "t", remaining_requests=0, reset_requests=7),
            Reserve(0, "t", Refused(7)),
            Reserve(0, "t", Go("t", 7), max_wait=10),
            Reserve(0, "t", Go("t", 8), max_wait=10),
        ],
    ),
    (
        "sync_budget: a few requests left, then one a second",
        [
            Sync(0, "t", remaining_requests=2, reset_requests=30),
            Reserve(0, "t", Go("t")),
            Reserve(0, "t", Go("t")),
            Reserve(0, "t", Refused(1)),
        ],
    ),
    (
        "retry_after is the soonest of budgets and cooldowns",
        [
            Reserve(0, "b", Go("b", 0)),
            Reserve(0, "b", Go("b", 1), max_wait=1),
            Settle(0, "a", cool(3), cooled(3)),
            Reserve(0, "ab", Refused(1, cooling=True), max_wait=1),  # b: 2 s - 1
            Reserve(0, "b", Refused(2, cooling=False)),  # merely out of budget
        ],
    ),
    (
        "a cooling candidate's budget can make its retry later than its cooldown",
        [
            Reserve(0, "a", Go("a")),
            Reserve(0, "a", Go("a", 1), max_wait=10),
            Reserve(0, "a", Go("a", 2), max_wait=10),  # a's next turn: 3 s
            Settle(0, "a", cool(1), cooled(1)),
            Reserve(0, "a", Refused(3, cooling=True)),
            Reserve(0, "a", Refused(1, cooling=True), max_wait=5),
        ],
    ),
    (
        "too large for every candidate is not retryable; too large for the healthy ones is",
        [
            Reserve(0, "ts", TOO_LARGE, tokens=1001),
            Settle(0, "t", cool(4), cooled(4)),
            Reserve(0, "ts", Refused(4, cooling=True), tokens=500),
            Reserve(0, "st", Go("s"), tokens=50),
        ],
    ),
    (
        "a cooled deployment left idle for FORGET_AFTER after its cooldown is healthy again",
        [
            Settle(0, "a", cool(5), cooled(5)),
            Reserve(5 + FORGET_AFTER, "a", Go("a", probe=False)),
        ],
    ),
    (
        "corrections and health in one settlement",
        [
            Reserve(0, "t", Go("t"), tokens=1000, lease="r"),
            Settle(0, "t", FAIL, lease="r", tokens=-1000),  # nothing generated: refund
            Reserve(0, "t", Go("t"), tokens=1000),
        ],
    ),
]


class Driver:
    def __init__(self, make: Callable[[Callable[[], float]], Limiter]) -> None:
        self.now = 0.0
        self.limiter = make(lambda: self.now)

    async def run(self, step: Step) -> object:
        self.now = step.at
        lim = self.limiter
        if isinstance(step, Reserve):
            candidates = [DEPLOYMENTS[i] for i in step.ids]
            verdict = await lim.reserve(
                GroupAsk(
                    "g",
                    candidates,
                    estimate_cost(step.tokens),
                    step.max_wait,
                    slot=step.lease,
                    least_busy=step.least_busy,
                )
            )
            return _result(verdict)
        if isinstance(step, Settle):
            return await lim.settle(
                DeploymentSettlement(
                    "g",
                    DEPLOYMENTS[step.id],
                    slot=step.lease,
                    outcome=step.outcome,
                    rule=RULE,
                    cost={"requests": step.requests, "tokens": step.tokens},
                    sent=step.sent,
                )
            )
        if isinstance(step, Sync):
            await lim.settle(
                DeploymentSettlement(
                    "g",
                    DEPLOYMENTS[step.id],
                    RULE,
                    remaining=Remaining(
                        requests=step.remaining_requests,
                        requests_wait=step.reset_requests,
                        tokens=step.remaining_tokens,
                    ),
                )
            )
            return None
        states = await lim.snapshot("g", [DEPLOYMENTS[i] for i in step.expect])
        return {i: state.unusable_for for i, state in states.items()}


def _result(verdict: DeploymentVerdict) -> Expect:
    if verdict.deployment_id is not None:
        return Go(verdict.deployment_id, verdict.wait, verdict.probe)
    if verdict.code == "request_too_large":
        return TOO_LARGE
    assert verdict.code == "model_capacity"
    return Refused(verdict.retry_after, verdict.cooling)


def _expected(step: Step) -> object:
    def near(x: float) -> object:
        return pytest.approx(x, rel=1e-9, abs=1e-9)

    if isinstance(step, Reserve):
        e = step.expect
        if isinstance(e, Go):
            return Go(e.deployment, near(e.wait), e.probe)  # type: ignore[arg-type]
        if isinstance(e, Refused):
            return Refused(near(e.retry_after), e.cooling)  # type: ignore[arg-type]
        return e
    if isinstance(step, Settle):
        e2 = step.expect
        return HealthChange(e2.cooled, e2.recovered, near(e2.cool_for), e2.epoch)  # type: ignore[arg-type]
    if isinstance(step, Sync):
        return None
    return {k: near(v) for k, v in step.expect.items()}


BACKENDS = ["memory", "redis", "redis-cluster"]


@pytest.fixture(params=BACKENDS)
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    backend: str = request.param
    if backend == "memory":
        d = Driver(lambda clock: MemoryLimiter(clock))
    else:
        url: str = request.getfixturevalue(
            "redis_url" if backend == "redis" else "redis_cluster_url"
        )
        d = Driver(lambda clock: patient(url, clock=clock))
    yield d
    await d.limiter.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(("description", "steps"), CASES, ids=[c[0] for c in CASES])
async def test_health_case(driver: Driver, description: str, steps: list[Step]) -> None:
    for i, step in enumerate(steps):
        got = await driver.run(step)
        assert got == _expected(step), (description, i, step)
