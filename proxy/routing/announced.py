"""What upstreams announce of their limits, and for how long it holds (pure).

An upstream's ``x-ratelimit-limit-*`` can lower a deployment's per-minute pacing below its
configured limit; the catalog's limits (``Catalog.limits``, the one place they come from)
read them here. This is the only state about limits that changes while the proxy serves,
so it has its own owner; a reload carries it over for deployments whose config did not
change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from proxy.config import Deployment
from proxy.limiter.base import DeploymentLimits

if TYPE_CHECKING:
    from proxy.catalog import DeploymentRoute, GroupRoute

__all__ = ["ANNOUNCED_FLOOR", "ANNOUNCED_FOR", "Announced", "announced_limits", "announced_lower"]

# What an upstream announces (x-ratelimit-limit-*) can lower a deployment's per-minute
# pacing, but not below this share of its configured limit (one lying answer of "1"
# must not stall it: the 429s teach a real lower limit, health.py)...
ANNOUNCED_FLOOR = 0.1
# ...and only while it is announced again: upstreams announce on every answer, so an
# announcement not repeated for this long is forgotten (the configured limits return).
ANNOUNCED_FOR = 60.0


def announced_limits(
    limits: DeploymentLimits, share: float, lower: dict[str, int], headroom: float
) -> DeploymentLimits:
    """``limits`` with the per-minute windows ``lower`` names (``rpm``, ``tpm``) refilled
    at that many a minute instead: pacing only. Capacities and the largest request a
    window admits stay the configured ones."""
    windows = []
    for w in limits.windows:
        amount = lower.get(w.name)
        if amount is not None:
            paced = amount * share * (1.0 - headroom)
            w = replace(w, rate=replace(w.rate, limit=paced))
        windows.append(w)
    return replace(limits, windows=tuple(windows))


def announced_lower(
    configured: Deployment, requests: float | None, tokens: float | None
) -> dict[str, int]:
    """The per-minute limits an upstream's announcement lowers (``rpm``, ``tpm``): what
    it announces, never below ``ANNOUNCED_FLOOR`` of the configured limit."""
    lower: dict[str, int] = {}
    for field, announced in (("rpm", requests), ("tpm", tokens)):
        limit = getattr(configured, field)
        if announced is None or not limit:
            continue
        amount = max(int(announced), math.ceil(limit * ANNOUNCED_FLOOR))
        if amount < limit:
            lower[field] = amount
    return lower


class Announced:
    """Deployments whose upstream announced lower per-minute limits than configured, and
    until when (``ANNOUNCED_FOR`` after it last said so). ``share``: this process's part
    of every budget; ``headroom``: how far below a limit windows of a minute pace."""

    def __init__(self, share: float, headroom: float, clock: Callable[[], float]) -> None:
        self.share = share
        self.headroom = headroom
        self.clock = clock
        self._lowered: dict[str, tuple[DeploymentLimits, float]] = {}

    def limits(self, deployment: DeploymentRoute) -> DeploymentLimits:
        """The deployment's limits: configured, or paced as its upstream announces."""
        announced = self._lowered.get(deployment.id)
        if announced is None:
            return deployment.limits
        limits, until = announced
        if self.clock() < until:
            return limits
        del self._lowered[deployment.id]  # not announced again: forgotten
        return deployment.limits

    def announce(
        self, deployment: DeploymentRoute, requests: float | None, tokens: float | None
    ) -> dict[str, int]:
        """The upstream says its per-minute limits are ``requests`` and ``tokens`` (None:
        not said): a configured limit above it paces at it (``announced_lower``) for
        ``ANNOUNCED_FOR``. Returns what changed (nothing when it says it again)."""
        lower = announced_lower(deployment.config, requests, tokens)
        if not lower:
            if requests is not None or tokens is not None:  # what it says now is no lower
                self._lowered.pop(deployment.id, None)
            return {}
        until = self.clock() + ANNOUNCED_FOR
        limits = announced_limits(deployment.limits, self.share, lower, self.headroom)
        previous = self._lowered.get(deployment.id)
        self._lowered[deployment.id] = (limits, until)
        return {} if previous is not None and previous[0] == limits else lower

    def carry_over(
        self,
        previous: Announced,
        before: Mapping[str, GroupRoute],
        now: Mapping[str, GroupRoute],
    ) -> None:
        """After a reload (the groups ``before`` it and ``now``): what upstreams announced
        still holds for deployments whose config did not change."""
        configs = {d.id: d.config for g in now.values() for d in g.deployments}
        old = {d.id: d.config for g in before.values() for d in g.deployments}
        for deployment_id, limits in previous._lowered.items():
            if deployment_id in configs and configs[deployment_id] == old.get(deployment_id):
                self._lowered[deployment_id] = limits
