"""What upstreams announce of their limits, and for how long it holds (pure).

An upstream's ``x-ratelimit-limit-*`` (Anthropic's ``anthropic-ratelimit-*-limit``, per
kind) can lower a deployment's per-minute pacing below its configured limit of that kind;
the catalog's limits (``Catalog.limits``, the one place they come from) read them here.
This is the only state about limits that changes while the proxy serves, so it has its
own owner; a reload carries it over for deployments whose config did not change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from proxy.catalog.pacing import pacing_headroom
from proxy.config.settings import Deployment
from proxy.limiter.base import MINUTE, DeploymentLimits, window_name

if TYPE_CHECKING:
    from proxy.catalog.pacing import Pacing

__all__ = [
    "ANNOUNCED_FLOOR",
    "ANNOUNCED_FOR",
    "ANNOUNCED_KINDS",
    "Announced",
    "announced_limits",
    "announced_lower",
    "minute_rules",
]

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
    """``limits`` with the per-minute windows ``lower`` names (``rpm``, ``tpm``...) refilled
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


# The kinds an announcement names, in the order ``Announced.announce`` takes them.
ANNOUNCED_KINDS = ("requests", "tokens", "input_tokens", "output_tokens")
# A per-minute window: its kind's place in ANNOUNCED_KINDS, its configured limit, the
# lowest an announcement takes it to (ANNOUNCED_FLOOR of it), its name.
MinuteRule = tuple[int, int, int, str]


def minute_rules(configured: Deployment) -> tuple[MinuteRule, ...]:
    """The deployment's per-minute windows of a kind upstreams announce (they announce
    per-minute limits), built once per deployment: an announcement is read on every
    answer."""
    return tuple(
        (
            ANNOUNCED_KINDS.index(rule.kind),
            rule.amount,
            math.ceil(rule.amount * ANNOUNCED_FLOOR),
            window_name(rule.kind, rule.per),
        )
        for rule in configured.limit_rules()
        if rule.per == MINUTE and rule.kind in ANNOUNCED_KINDS
    )


def announced_lower(
    rules: tuple[MinuteRule, ...], said: tuple[float | None, ...]
) -> dict[str, int] | None:
    """The per-minute windows (``rules``) an upstream's announcement lowers, by name
    (``rpm``, ``tpm``, ``input_tokens_1m``...): what it announces for their kind
    (``said``: per-minute limits in the order of ``ANNOUNCED_KINDS``, None: not said),
    never below ``ANNOUNCED_FLOOR`` of the configured limit. None: it lowers nothing."""
    lower: dict[str, int] | None = None
    for index, limit, floor, name in rules:
        value = said[index]
        if value is not None and value < limit:
            amount = max(int(value), floor)
            if amount < limit:
                if lower is None:
                    lower = {}
                lower[name] = amount
    return lower


_NOTHING_SAID = (None, None, None, None)


class Routed(Protocol):
    """What this reads of a deployment (the catalog's ``DeploymentRoute``)."""

    @property
    def id(self) -> str: ...

    @property
    def config(self) -> Deployment: ...


R = TypeVar("R", bound=Routed)


class Announced(Generic[R]):
    """Deployments whose upstream announced lower per-minute limits than configured, and
    until when (``ANNOUNCED_FOR`` after it last said so); and every deployment's limits
    paced with the margin in force (``pacing``: measured, it moves; the limits are built
    again when it does, once per deployment). ``share``: this process's part of every
    budget."""

    def __init__(
        self,
        share: float,
        pacing: Pacing,
        clock: Callable[[], float],
        repaced: Callable[[R, float, float], DeploymentLimits],
    ) -> None:
        self.share = share
        self.repaced = repaced  # a deployment's limits for (share, margin): catalog's
        self.pacing = pacing
        self.clock = clock
        # By deployment: what its upstream announced (the windows it lowers) and until when.
        self._lowered: dict[str, tuple[dict[str, int], float]] = {}
        self._rules: dict[str, tuple[MinuteRule, ...]] = {}  # by deployment, built once
        # By deployment: its limits paced with ``_margin`` (announcements included).
        self._margin = pacing.margin()
        self._paced: dict[str, DeploymentLimits] = {}

    def limits(self, deployment: R) -> DeploymentLimits:
        """The deployment's limits: configured, or paced as its upstream announces; paced
        with the margin in force."""
        margin = self.pacing.margin()
        if margin != self._margin:  # the margin moved: every deployment's limits too
            self._margin = margin
            self._paced.clear()
        announced = self._lowered.get(deployment.id)
        if announced is not None and self.clock() >= announced[1]:
            del self._lowered[deployment.id]  # not announced again: forgotten
            self._paced.pop(deployment.id, None)
            announced = None
        paced = self._paced.get(deployment.id)
        if paced is None:
            paced = self._paced[deployment.id] = self._build(deployment, announced)
        return paced

    def _build(
        self, deployment: R, announced: tuple[dict[str, int], float] | None
    ) -> DeploymentLimits:
        margin = self._margin
        limits = self.repaced(deployment, self.share, margin)
        if announced is None:
            return limits
        return announced_limits(limits, self.share, announced[0], pacing_headroom(margin))

    def announce(
        self,
        deployment: R,
        requests: float | None,
        tokens: float | None,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
    ) -> dict[str, int]:
        """The upstream says its per-minute limits are these, per kind (None: not said;
        Anthropic says input and output tokens apart): a configured per-minute window of
        that kind above it paces at it (``announced_lower``) for ``ANNOUNCED_FOR``.
        Returns what changed (nothing when it says it again)."""
        said = (requests, tokens, input_tokens, output_tokens)
        rules = self._rules.get(deployment.id)
        if rules is None:
            rules = self._rules[deployment.id] = minute_rules(deployment.config)
        lower = announced_lower(rules, said)
        if lower is None:
            if said != _NOTHING_SAID and self._lowered.pop(deployment.id, None) is not None:
                self._paced.pop(deployment.id, None)  # what it says now is no lower
            return {}
        until = self.clock() + ANNOUNCED_FOR
        previous = self._lowered.get(deployment.id)
        self._lowered[deployment.id] = (lower, until)
        if previous is not None and previous[0] == lower:
            return {}
        self._paced.pop(deployment.id, None)
        return lower

    def carry_over(
        self,
        previous: Announced[R],
        before: Iterable[R],
        now: Iterable[R],
    ) -> None:
        """After a reload (the deployments ``before`` it and ``now``): what upstreams
        announced still holds for deployments whose config did not change."""
        configs = {d.id: d.config for d in now}
        old = {d.id: d.config for d in before}
        for deployment_id, limits in previous._lowered.items():
            if deployment_id in configs and configs[deployment_id] == old.get(deployment_id):
                self._lowered[deployment_id] = limits
