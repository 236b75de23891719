"""Settling deployments after the fact, off the request's path.

A reserved turn is settled once its upstream call ended (or was never made): the token
estimate is corrected to the real usage, an unused turn is given back, the in-flight
lease freed, and the answer's meaning recorded in the deployment's health. The common
case, a success that would change nothing, costs no storage call at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.background import Background
from proxy.catalog import Catalog, DeploymentRoute
from proxy.limiter.base import (
    NEUTRAL,
    CooldownRule,
    DeploymentSettlement,
    Limiter,
    Outcome,
    Remaining,
)
from proxy.routing.events import Events

__all__ = ["Settler", "Turn"]


@dataclass(frozen=True, slots=True)
class Turn:
    """A reserved turn on a deployment, named by its lease."""

    deployment: DeploymentRoute
    lease: str
    probe: bool = False  # a half-open probe of a cooled deployment: its answer must count


class Settler:
    def __init__(
        self,
        limiter: Limiter,
        catalog: Catalog,
        rule: CooldownRule,
        background: Background,
        events: Events,
        *,
        least_busy: bool,
    ) -> None:
        self.limiter = limiter
        self.catalog = catalog
        self.rule = rule
        self.background = background
        self.events = events
        # Only least-busy routing keeps in-flight leases, which every answer must free.
        self.least_busy = least_busy

    def settle(
        self,
        turn: Turn,
        outcome: Outcome,
        *,
        estimate: int,
        real_tokens: int | None,
        requests: float = 0.0,
    ) -> None:
        """Settle ``turn`` in the background. Unknown usage (``real_tokens`` None: an
        error, no usage in the answer) refunds the whole ``estimate``."""
        limits = self.catalog.limits(turn.deployment)
        tokens = float((real_tokens or 0) - estimate)
        corrects_tokens = tokens != 0 and any(w.kind == "tokens" for w in limits.windows)
        if (
            outcome.kind == "success"
            and not turn.probe
            and not self.least_busy
            and requests == 0
            and not corrects_tokens
        ):
            return  # the common case: it would change nothing
        self._send(
            turn.deployment,
            DeploymentSettlement(
                turn.deployment.group,
                limits,
                self.rule,
                outcome,
                lease=turn.lease,
                requests=requests,
                tokens=tokens,
            ),
        )

    def give_back(self, turn: Turn, estimate: int) -> None:
        """A reserved turn goes unused: return it, so the next request can take it."""
        self.settle(turn, NEUTRAL, estimate=estimate, real_tokens=0, requests=-1.0)

    def report(self, deployment: DeploymentRoute, remaining: Remaining) -> None:
        """The upstream has less left than the windows may say: bring them down to it."""
        limits = self.catalog.limits(deployment)
        self._send(
            deployment,
            DeploymentSettlement(deployment.group, limits, self.rule, NEUTRAL, remaining=remaining),
        )

    def _send(self, deployment: DeploymentRoute, settlement: DeploymentSettlement) -> None:
        async def run() -> None:
            change = await self.limiter.settle(settlement)
            if change.cooled or change.recovered:
                self.events.health_changed(
                    deployment.group, deployment.id, settlement.outcome, change
                )

        self.background.run(run())
