"""Small helpers for limiter tests: windows by their usual names, health by id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.limiter.base import DeploymentLimits, Limiter, Rate, Window, window_name
from proxy.limiter.redis import RedisLimiter


def window(kind: str, limit: float, period: float = 60.0, capacity: float | None = None) -> Window:
    """``limit`` per ``period`` seconds, ``capacity`` at once (default: all of it)."""
    assert kind in ("requests", "tokens")
    rate = Rate(limit, period, limit if capacity is None else capacity)
    return Window(window_name(kind, period), kind, rate)  # type: ignore[arg-type]


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
