"""Gauges that describe state rather than events, refreshed in the background: what is
left in each deployment's budget and whether it is cooling down, as the (shared) limiter
sees it, so every replica's dashboard agrees."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from proxy.catalog import Catalog
from proxy.limiter.base import ManagedLimiter
from proxy.metrics import Metrics

__all__ = ["StateObserver"]

logger = logging.getLogger("proxy.observer")

INTERVAL = 5.0  # seconds; one limiter call per model group each time


class StateObserver:
    def __init__(
        self,
        catalog: Catalog,
        limiter: ManagedLimiter,
        metrics: Metrics,
        interval: float = INTERVAL,
    ) -> None:
        self.catalog = catalog
        self.limiter = limiter
        self.metrics = metrics
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        # Seconds until each deployment is usable, as last seen (empty until then).
        self.unusable_for: dict[str, float] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> None:
        for group in self.catalog.groups.values():
            limits = [d.limits for d in group.deployments]
            budget = await self.limiter.deployment_budget(group.name, limits)
            health = await self.limiter.deployment_health(group.name, [d.id for d in limits])
            for deployment_id, left in budget.items():
                for kind, value in left.items():
                    self.metrics.set_budget_remaining(group.name, deployment_id, kind, value)
            for deployment_id, unusable_for in health.items():
                self.metrics.set_deployment_state(group.name, deployment_id, unusable_for > 0)
            self.unusable_for.update(health)

    def usable(self) -> int:
        """Deployments that can take a request now (all of them until first seen)."""
        total = sum(len(g.deployments) for g in self.catalog.groups.values())
        return total - sum(1 for wait in self.unusable_for.values() if wait > 0)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a dashboard gauge is never worth a crash
                logger.debug("refreshing state gauges failed", exc_info=True)
            await asyncio.sleep(self.interval)
