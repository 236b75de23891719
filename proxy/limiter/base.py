"""The limiter's contract: rules in, verdicts out, whatever the storage.

Two questions are asked per request, each answered in one step (one Redis round trip):

* ``acquire_key``: may this client key send one more request costing ``tokens``?
  Client keys get an answer at once (they never wait): all of rpm, tpm and
  max_parallel pass, or nothing is charged and the verdict names the limit hit.
* ``reserve_deployment``: which of these deployments of one model group can take
  the request soonest, and when? The chosen deployment's budget is reserved for that
  exact turn; the caller sleeps ``wait`` seconds and then forwards (no polling).

Afterwards the caller settles: ``release_key`` frees the parallel slot and corrects the
token estimate to the real usage; ``settle_deployment`` does the same for the deployment,
frees its in-flight lease and records what the answer says about the deployment's health
(cooldowns, half-open probes, the effective rate learned from 429s), in one step.
``correct_deployment`` only corrects (e.g. gives back a reserved turn nobody used), and
``sync_budget`` lowers a deployment's buckets to what the upstream says it has left.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` units per ``period`` seconds, at most ``capacity`` units at once."""

    limit: float
    period: float
    capacity: float

    def __post_init__(self) -> None:
        if not (self.limit > 0 and self.period > 0 and self.capacity > 0):
            raise ValueError(f"a Rate needs positive limit, period and capacity: {self}")

    @property
    def interval(self) -> float:
        """Seconds one unit of budget takes to refill."""
        return self.period / self.limit


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A client key's own limits; ``None`` means unlimited."""

    name: str
    rpm: Rate | None = None
    tpm: Rate | None = None
    max_parallel: int | None = None


@dataclass(frozen=True, slots=True)
class DeploymentLimits:
    """One upstream deployment's budget; ``None`` means unlimited.

    ``probe_timeout``: the longest one upstream call may take (the deployment's timeout).
    A half-open probe blocks the deployment at most that long after its turn, and an
    in-flight lease stops counting a little after it."""

    id: str
    rpm: Rate | None = None
    tpm: Rate | None = None
    probe_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class CooldownRule:
    """``allowed_fails`` counted failures within ``window`` seconds cool a deployment
    for ``time`` seconds (the config's ``routing.cooldown``)."""

    allowed_fails: int
    window: float
    time: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an upstream answer means for the deployment's health.

    ``kind``: ``"success"`` (a probing deployment is healthy again), ``"failure"``
    (counts toward ``allowed_fails``, or cools at once with ``cool_for``), ``"neutral"``
    (no health change: the client's own error, a cancelled request). ``reason`` labels
    metrics and logs ("timeout", "connection", "server_error", "rate_limited", "auth").
    ``cool_for``: cool at once for this long (a 429's retry-after or reset, a bad key).
    ``rate_limited``: an upstream 429, which also lowers the effective rate (AIMD)."""

    kind: Literal["success", "failure", "neutral"]
    reason: str = ""
    cool_for: float | None = None
    rate_limited: bool = False


@dataclass(frozen=True, slots=True)
class HealthChange:
    """What ``settle_deployment`` did to the deployment's health."""

    cooled: bool = False  # a cooldown started or was extended by this call
    recovered: bool = False  # a probe succeeded: healthy again
    cool_for: float = 0.0  # seconds from now until the cooldown ends; 0 if not cooling


NO_CHANGE = HealthChange()


@dataclass(frozen=True, slots=True)
class Usage:
    """What a bucket looks like after a decision, for x-ratelimit-* headers."""

    limit: float
    remaining: float
    reset: float  # seconds until the bucket is full again


@dataclass(frozen=True, slots=True)
class KeyVerdict:
    allowed: bool
    # None when allowed; else "key_rpm" | "key_tpm" | "key_parallel" | "request_too_large"
    code: str | None = None
    retry_after: float = 0.0  # seconds; meaningful when not allowed
    requests: Usage | None = None  # None when the key has no rpm
    tokens: Usage | None = None  # None when the key has no tpm


@dataclass(frozen=True, slots=True)
class DeploymentVerdict:
    # The deployment reserved, or None when none can take the request within max_wait.
    deployment_id: str | None
    wait: float = 0.0  # seconds to sleep before forwarding (0 = go now)
    # None when reserved; else "model_capacity" | "request_too_large"
    code: str | None = None
    # Refused: seconds until the soonest candidate could take the request (its budget
    # within max_wait, or its cooldown over, or its probe's deadline).
    retry_after: float = 0.0
    # Per candidate, seconds until it could take the request: its turn, or for one held
    # by its health the later of the health and budget waits; inf: too large for it.
    waits: dict[str, float] = field(default_factory=dict)
    probe: bool = False  # the reserved request is a half-open probe of a cooled deployment
    # Refused while some candidate that could take the request is held by its health
    # (cooling down, or its probe is out): the model is unavailable, not out of budget.
    cooling: bool = False


class StorageError(Exception):
    """The shared storage could not answer (connection, timeout, script error)."""


class LimiterUnavailable(Exception):
    """No verdict can be given: the shared storage is down and ``on_error`` is ``reject``.
    The HTTP layer answers 503. Deliberately not a StorageError: it is the policy's
    answer, not a storage failure to be handled again."""


class LimiterMode(enum.Enum):
    """Where a limiter's verdicts currently come from."""

    SHARED = "shared"  # the shared storage (Redis): budgets are global
    FALLBACK = "fallback"  # storage down, answering from this process's share
    UNAVAILABLE = "unavailable"  # storage down and on_error=reject: LimiterUnavailable
    MEMORY = "memory"  # no shared storage configured: in-process budgets


class Limiter(Protocol):
    async def acquire_key(self, limits: KeyLimits, lease_id: str, tokens: float) -> KeyVerdict:
        """All-or-nothing check of a key's rpm (cost 1), tpm (cost ``tokens``) and parallel
        slots (``lease_id`` names the slot). Never waits."""
        ...

    async def release_key(self, limits: KeyLimits, lease_id: str, token_correction: float) -> None:
        """Free the parallel slot ``lease_id``; add ``token_correction`` (real minus
        estimated; negative refunds) to the key's token bucket."""
        ...

    async def reserve_deployment(
        self,
        group: str,
        candidates: Sequence[DeploymentLimits],
        tokens: float,
        max_wait: float,
        *,
        lease_id: str = "",
        least_busy: bool = False,
    ) -> DeploymentVerdict:
        """Reserve 1 request and ``tokens`` on the candidate whose turn comes soonest
        (the first in ``candidates`` order among equals; a candidate that can go now
        always beats one that must wait). Nothing is charged when no candidate's turn
        is within ``max_wait``.

        A candidate that is cooling down or has a probe out is not reservable at all; one
        whose cooldown is over takes exactly one request, its probe (``verdict.probe``).
        Budgets refill at the rate learned from 429s. ``least_busy``: among those that can
        go now, the one with the fewest requests in flight across replicas. ``lease_id``
        counts the request in the chosen deployment's in-flight set until it is settled
        (or ``probe_timeout`` plus a margin after its turn)."""
        ...

    async def correct_deployment(
        self,
        group: str,
        deployment: DeploymentLimits,
        requests: float,
        tokens: float,
    ) -> None:
        """Add corrections to a deployment's buckets: ``requests=-1`` gives back a turn
        that was reserved but not used; ``tokens`` is real minus estimated usage."""
        ...

    async def settle_deployment(
        self,
        group: str,
        deployment: DeploymentLimits,
        *,
        lease_id: str,
        outcome: Outcome,
        rule: CooldownRule,
        requests: float = 0.0,
        tokens: float = 0.0,
    ) -> HealthChange:
        """After the upstream answered (or the request was abandoned): free ``lease_id``
        from the in-flight set, correct the buckets as ``correct_deployment`` does, and
        record ``outcome`` in the deployment's health. One step."""
        ...

    async def sync_budget(
        self,
        group: str,
        deployment: DeploymentLimits,
        *,
        remaining_requests: float | None,
        reset_requests: float | None,
        remaining_tokens: float | None,
        reset_tokens: float | None,
    ) -> None:
        """The upstream has less left than the buckets say (another client shares it):
        bring them down to it, never up. ``None``: unknown. ``remaining_requests == 0``
        with ``reset_requests``: no request before then. ``reset_tokens`` is not used (a
        token reset is the time until full, which says nothing about the next request)."""
        ...

    async def deployment_budget(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, dict[str, float]]:
        """What is left now in each deployment's buckets: ``{id: {"requests": n,
        "tokens": n}}`` (kinds without a limit are absent). For dashboards."""
        ...

    async def deployment_health(self, group: str, ids: Sequence[str]) -> dict[str, float]:
        """Seconds until each deployment may take a request: 0 when healthy or a probe
        may go, the rest of its cooldown, or the deadline of the probe that is out."""
        ...

    async def aclose(self) -> None: ...


class ManagedLimiter(Limiter, Protocol):
    """What ``create_limiter`` returns: a Limiter plus its lifecycle and health."""

    @property
    def mode(self) -> LimiterMode: ...

    @property
    def fallback_active(self) -> bool:
        """True while verdicts come from the local share because the storage is down."""
        ...

    @property
    def ready(self) -> bool:
        """Verdicts can be given (storage reachable or a fallback in use)."""
        ...

    @property
    def storage_available(self) -> bool:
        """The shared storage answers (always True without one)."""
        ...

    def on_mode_change(self, callback: Callable[[LimiterMode], None]) -> None:
        """Call ``callback(new_mode)`` on every change (for metrics and readiness)."""
        ...

    def on_storage_error(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(operation)`` each time the shared storage fails an operation
        (the method name, e.g. ``"reserve_deployment"``; for metrics)."""
        ...

    async def start(self) -> None:
        """Start background work (replica heartbeats). Pair with ``aclose``."""
        ...
