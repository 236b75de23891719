"""Small helpers for limiter tests: windows by their usual names, health by id, the
settlement's rule, backends on an injected clock, and times in UTC."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.limiter.base import CooldownRule, DeploymentLimits, Limiter, Rate, Window, window_name
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.redis.backend import RedisLimiter

# A settlement's rule: three failures within a minute cool a deployment down for 30 s.
RULE = CooldownRule(allowed_fails=3, window=60.0, time=30.0)


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    """That moment in UTC, as Unix seconds (a budget's calendar is UTC's)."""
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC).timestamp()


def window(kind: str, limit: float, period: float = 60.0, capacity: float | None = None) -> Window:
    """``limit`` of ``kind`` per ``period`` seconds, ``capacity`` at once (default: all
    of it)."""
    rate = Rate(limit, period, limit if capacity is None else capacity)
    return Window(window_name(kind, period), kind, rate)


def rpm(limit: float, capacity: float | None = None) -> Window:
    return window("requests", limit, 60.0, capacity)


def tpm(limit: float, capacity: float | None = None) -> Window:
    return window("tokens", limit, 60.0, capacity)


async def unusable(
    limiter: Limiter, group: str, deployments: Sequence[DeploymentLimits]
) -> dict[str, float]:
    """Seconds until each deployment may take a request, by id (from ``snapshot``)."""
    states = await limiter.snapshot(group, deployments)
    return {i: state.unusable_for for i, state in states.items()}


class Clock:
    """An injected clock: tests move ``now`` by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def patient(url: str, **options: Any) -> RedisLimiter:
    """A Redis limiter with generous timeouts: tests check results, not latency, on a
    possibly busy machine."""
    return RedisLimiter(url, op_timeout=5.0, socket_timeout=2.0, connect_timeout=2.0, **options)


# The Redis fixtures a contract test runs a backend on, by backend.
URL_FIXTURES = {
    "redis": "redis_url",
    "redis-cluster": "redis_cluster_url",
    "redis-tls-acl": "tls_redis_url",
}


@dataclass
class Subject:
    """A limiter under test and the clock it reads."""

    limiter: Limiter
    clock: Clock


async def subject_of(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    """A fixture's body: the backend ``request.param`` names ("memory" or one of
    ``URL_FIXTURES``) on an injected clock, closed after the test."""
    clock = Clock(1_700_000_000.0)
    limiter: Limiter
    if request.param == "memory":
        limiter = MemoryLimiter(clock)
    else:
        limiter = patient(request.getfixturevalue(URL_FIXTURES[request.param]), clock=clock)
    yield Subject(limiter, clock)
    await limiter.aclose()


def subjects(*backends: str, name: str = "s") -> Callable[..., AsyncIterator[Subject]]:
    """A fixture named ``name``: each test that asks for it runs once per backend
    (``subject_of``), "memory" or one of ``URL_FIXTURES``."""

    @pytest.fixture(params=list(backends), name=name)
    async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
        async for made in subject_of(request):
            yield made

    return subject
