"""Gauges that describe state rather than events, refreshed in the background: what is
left in each deployment's budget and whether it is cooling down, as the (shared) limiter
sees it, so every replica's dashboard agrees."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from proxy.background import stop
from proxy.catalog.catalog import Catalog, key_limits
from proxy.config.settings import ClientKey, Deployment, Settings
from proxy.limiter.base import MINUTE, ManagedLimiter
from proxy.limiter.core.verdicts import key_codes
from proxy.observability.metrics import Metrics

__all__ = ["StateObserver", "publish_configured_state", "shadow_keys_of"]

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

    def follow(self, catalog: Catalog) -> None:
        """After a reload: observe the new config's deployments (and only them)."""
        ids = {d.id for g in catalog.groups.values() for d in g.deployments}
        self.unusable_for = {i: wait for i, wait in self.unusable_for.items() if i in ids}
        self.catalog = catalog

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        await stop(self._task)

    async def refresh(self) -> None:
        catalog = self.catalog
        self.metrics.set_pacing_margin(catalog.pacing.margin())
        for group in catalog.groups.values():
            limits = {d.id: catalog.limits(d) for d in group.deployments}
            states = await self.limiter.snapshot(group.name, list(limits.values()))
            if self.catalog is not catalog:
                return  # reloaded meanwhile: no series for what it removed
            for deployment_id, state in states.items():
                # The per-minute windows: what llmproxy_deployment_budget_remaining shows.
                for window in limits[deployment_id].windows:
                    if window.rate.period == MINUTE and window.name in state.remaining:
                        left = state.remaining[window.name]
                        self.metrics.set_budget_remaining(
                            group.name, deployment_id, window.kind, left
                        )
                unusable = state.unusable_for
                self.metrics.set_deployment_state(group.name, deployment_id, unusable > 0)
                self.unusable_for[deployment_id] = unusable

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


def shadow_keys_of(settings: Settings) -> list[ClientKey]:
    return [key for key in settings.keys.full() if key.shadow]  # a plain key has no shadow


def publish_configured_state(
    settings: Settings,
    metrics: Metrics,
    share: float,
    previous: Settings | None = None,
    shadow_keys: Sequence[ClientKey] | None = None,
) -> None:
    """Series visible before any traffic: every deployment healthy, its limits, each
    shadow key's would-be refusals. After a
    reload (``previous``): new deployments appear, removed ones and removed limits go.
    ``shadow_keys``: the config's shadow keys, when found beforehand (``shadow_keys_of``,
    in a reload's thread: 100,000 keys are not walked on the event loop)."""
    old = _deployments_of(previous)
    for group in settings.models:
        for d in group.deployments:
            was = old.pop((group.name, d.id), None)
            _publish_deployment(metrics, group.name, d, was, share)
    for model, deployment_id in old:
        metrics.forget_deployment(model, deployment_id)
    _publish_shadow_keys(
        settings, metrics, shadow_keys_of(settings) if shadow_keys is None else shadow_keys
    )
    if previous is None:
        metrics.set_fallback_active(False)


def _deployments_of(settings: Settings | None) -> dict[tuple[str, str], Deployment]:
    """The config's deployments by group name and id (none without a config): what a
    reload finds gone or changed."""
    if settings is None:
        return {}
    return {(g.name, d.id): d for g in settings.models for d in g.deployments}


def _publish_deployment(
    metrics: Metrics, group: str, d: Deployment, was: Deployment | None, share: float
) -> None:
    """A new deployment's series made (``was``: None), else its per-minute limits set to
    this process's share, or forgotten if the reload removed them."""
    if was is None:
        metrics.init_deployment(
            group,
            d.id,
            rpm=d.rpm * share if d.rpm is not None else None,
            tpm=d.tpm * share if d.tpm is not None else None,
        )
        return
    for kind, now, before in (("requests", d.rpm, was.rpm), ("tokens", d.tpm, was.tpm)):
        if now is not None:
            metrics.set_deployment_limit(group, d.id, kind, now * share)
        elif before is not None:
            metrics.forget_deployment_limit(group, d.id, kind)


def _publish_shadow_keys(
    settings: Settings, metrics: Metrics, shadow_keys: Sequence[ClientKey]
) -> None:
    """Each shadow key's would-be refusals at 0, not "no data", before the first."""
    for key in shadow_keys:
        team = settings.team(key.team) if key.team is not None else None
        limits = key_limits(key, team=None if team is None else key_limits(team))
        metrics.init_shadow_key(key.name, key_codes(limits))
