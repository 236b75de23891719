"""Settling deployments after the fact, off the request's path.

A reserved turn is settled once its upstream call ended (or was never made): a turn never
used is given back whole; a request that went is charged what its provider's limits count
of the usage its answer reports (``Counting.counted``, ``providers/*.py``): OpenAI and
Azure count a request's tokens when they admit it, as prompt plus ``max_tokens``, and
never give back what it did not use, so it keeps its charge and is charged more only when
it used more than estimated; Anthropic adjusts its count to the answer, so the charge
follows the usage down as well as up. More is believed only up to what one request can
take there (a larger count is no usage it could have admitted). Without usage (a stream
cut before it), the charge is kept, raised to what the stream is charged. A request the
upstream refused uncounted (``outcomes.admitted``: 400, 404, 413, 422) has its token
charge returned (one huge refused request would otherwise hold the deployment for every
key). The in-flight slot is freed and the answer's meaning recorded in the deployment's
health. The common case, a success that would change nothing, costs no storage call (an
adjusted count, Anthropic's, is changed by most answers: a call in the background).
"""

from __future__ import annotations

import asyncio

from proxy.background import Background
from proxy.catalog.catalog import Catalog, DeploymentRoute
from proxy.costs import NOTHING, Cost, TokenUsage, negated
from proxy.limiter.base import (
    NEUTRAL,
    CooldownRule,
    DeploymentLimits,
    DeploymentSettlement,
    Limiter,
    Outcome,
    Remaining,
    Sent,
)
from proxy.limiter.core.verdicts import settled_cost
from proxy.routing.events import Events
from proxy.values import value

__all__ = ["Settler", "Turn"]


@value
class Turn:
    """A reserved turn on a deployment, named by its slot (in the in-flight set)."""

    deployment: DeploymentRoute
    slot: str
    probe: bool = False  # a half-open probe of a cooled deployment: its answer must count
    sent: Sent | None = None  # what the limiter said of the turn (a 429 learns from it)
    # What it was reserved for: the request's estimate as the deployment's provider
    # counts it (without the cache reads it expects, where those do not count).
    cost: Cost = NOTHING
    # When it is due on this process's clock (time.monotonic: turn_clock.py), what the
    # request is late from when it leaves (the pacing margin measures it); None: unknown.
    moment: float | None = None


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
        # Only least-busy routing keeps in-flight slots, which every answer must free.
        self.least_busy = least_busy
        # The learning epoch (health.py) each deployment was last seen at: a turn of an
        # older epoch was reserved at a pace since found too fast. The latest, not the
        # largest: an epoch starts again from 0 when the limiter forgets an idle
        # deployment's health, a restarted Redis knows none, and the local fallback
        # counts its own; a turn is only dropped for a newer epoch of the same story.
        self.epochs: dict[str, int] = {}
        # Per deployment, set when a newer epoch is seen: the requests sleeping on turns
        # reserved before wake at once to take new ones (before later arrivals do).
        self._learning: dict[str, asyncio.Event] = {}
        # Per deployment, while a half-open probe granted here is out: set once its
        # settlement is in (the deployment recovered, or cooled again).
        self._probes: dict[str, asyncio.Event] = {}

    def saw(self, deployment_id: str, epoch: int) -> None:
        newer = epoch > self.epochs.get(deployment_id, 0)
        self.epochs[deployment_id] = epoch
        if newer and (learned := self._learning.pop(deployment_id, None)) is not None:
            learned.set()

    def learning(self, deployment_id: str) -> asyncio.Event:
        """Set once the deployment is seen to learn: every turn of it reserved before is
        stale from then on (``stale``)."""
        event = self._learning.get(deployment_id)
        if event is None:
            event = self._learning[deployment_id] = asyncio.Event()
        return event

    def probe_out(self, turn: Turn) -> None:
        """``turn`` was just granted; if it is a probe, requests refused meanwhile may
        wait for its answer (``probe_answered``) rather than fail."""
        if turn.probe:
            self._probes.setdefault(turn.deployment.id, asyncio.Event())

    def probe_answered(self, deployment_id: str) -> asyncio.Event | None:
        """Set once the probe out on that deployment from here is settled; None when
        none is out from here."""
        return self._probes.get(deployment_id)

    def stale(self, turn: Turn) -> bool:
        """Whether the deployment learned since ``turn`` was reserved: take it again."""
        return turn.sent is not None and self.epochs.get(turn.deployment.id, 0) > turn.sent.epoch

    def settle(
        self,
        turn: Turn,
        outcome: Outcome,
        *,
        estimate: Cost,
        used: Cost | None,
        refund: bool = False,
        usage: TokenUsage | None = None,
    ) -> asyncio.Task[None] | None:
        """Settle the turn of a request that went upstream, in the background: charged
        ``estimate``, it is settled to what its provider counts of the ``usage`` its
        answer reported; without one, what it ``used`` beyond its estimate is charged,
        per kind (None: unknown). Either way up to what one request can cost there.
        ``refund``: the upstream did not admit it, its estimate (but the request) is
        returned. Returns the settlement's task (None: nothing to settle), done once the
        limiter knows."""
        limits = self.catalog.limits(turn.deployment)
        windows = limits.windows
        if refund:
            extra = settled_cost(estimate, None, windows)
        elif usage is not None:  # the provider's rule says what stays charged
            counted = turn.deployment.provider.counting.counted(estimate, usage)
            extra = settled_cost(estimate, counted, windows)
        else:
            extra = settled_cost(estimate, used, windows, refund=False)
        corrects = bool(extra)  # (settled_cost: only kinds its windows count)
        if outcome.kind == "success" and not turn.probe and not self.least_busy and not corrects:
            return None  # the common case: it would change nothing
        sent = turn.sent if outcome.rate_limited or _leased(turn) else None
        return self._send(
            turn.deployment,
            turn.slot,
            outcome,
            cost=extra,
            sent=sent,
            probe=turn.probe,
            limits=limits,
        )

    def give_back(self, turn: Turn, estimate: Cost) -> None:
        """A reserved turn goes unused (nothing was sent): return it whole, so the next
        request can take it."""
        self._send(
            turn.deployment,
            turn.slot,
            NEUTRAL,
            cost=negated(estimate),
            sent=turn.sent if _leased(turn) else None,
            probe=turn.probe,
        )

    def spent(self, turn: Turn) -> None:
        """A reserved turn not sent, kept spent (too late: the turns after it stand): only
        what it holds is freed, least-busy's in-flight slot; nothing is given back."""
        if self.least_busy:
            self._send(turn.deployment, turn.slot, NEUTRAL)

    def report(self, deployment: DeploymentRoute, remaining: Remaining) -> None:
        """The upstream has less left than the windows may say: bring them down to it."""
        self._send(deployment, "", NEUTRAL, remaining=remaining)

    def _send(
        self,
        deployment: DeploymentRoute,
        lease: str,
        outcome: Outcome,
        *,
        cost: Cost = NOTHING,
        remaining: Remaining | None = None,
        sent: Sent | None = None,
        probe: bool = False,
        limits: DeploymentLimits | None = None,
    ) -> asyncio.Task[None]:
        """``limits``: the deployment's, when the caller has just read them."""
        if limits is None:
            limits = self.catalog.limits(deployment)
        settlement = DeploymentSettlement(
            deployment.group, limits, self.rule, outcome, lease, cost, remaining, sent
        )

        async def run() -> None:
            try:
                change = await self.limiter.settle(settlement)
            finally:
                if probe and (answered := self._probes.pop(deployment.id, None)) is not None:
                    answered.set()
            if change.cooled:  # a learning event comes with a hold (others tell nothing)
                self.saw(deployment.id, change.epoch)
            if change.cooled or change.recovered:
                self.events.health_changed(
                    deployment.group, deployment.id, settlement.outcome, change
                )

        return self.background.run(run())


def _leased(turn: Turn) -> bool:
    """Granted from the replica's lease: its settlements must say so (limiter/redis/leases.py)."""
    return turn.sent is not None and turn.sent.settles_back
