"""The limiter's contract: rules in, verdicts out, whatever the storage.

Two questions are asked per request, each answered in one step (one Redis round trip):

* ``acquire_key``: may this client key send one more request costing ``tokens``?
  Client keys get an answer at once (they never wait): all of rpm, tpm and
  max_parallel pass, or nothing is charged and the verdict names the limit hit.
* ``reserve_deployment``: which of these deployments of one model group can take
  the request soonest, and when? The chosen deployment's budget is reserved for that
  exact turn; the caller sleeps ``wait`` seconds and then forwards (no polling).

Afterwards the caller settles: ``release_key`` frees the parallel slot and corrects the
token estimate to the real usage; ``correct_deployment`` does the same for the
deployment (and gives back a reserved turn nobody used).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


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
    """One upstream deployment's budget; ``None`` means unlimited."""

    id: str
    rpm: Rate | None = None
    tpm: Rate | None = None


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
    retry_after: float = 0.0
    waits: dict[str, float] = field(default_factory=dict)  # per candidate, for routing/metrics


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
    ) -> DeploymentVerdict:
        """Reserve 1 request and ``tokens`` on the candidate whose turn comes soonest
        (the first in ``candidates`` order among equals; a candidate that can go now
        always beats one that must wait). Nothing is charged when no candidate's turn
        is within ``max_wait``."""
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

    async def start(self) -> None:
        """Start background work (replica heartbeats). Pair with ``aclose``."""
        ...
