"""The in-memory backend: the pure core over a dict, for one process.

Safe under concurrency within one event loop because every operation reads, decides and
writes without awaiting in between (the async methods only wrap synchronous ones). Not
shared between processes: with N workers each holds 1/N of every budget, which is the
caller's job (it passes divided rates). Idle state is forgotten once it is equivalent to
a full bucket, so memory stays bounded by the number of live keys and deployments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from proxy.limiter.base import (
    DeploymentLimits,
    DeploymentVerdict,
    KeyLimits,
    KeyVerdict,
    LimiterMode,
    Rate,
)
from proxy.limiter.bucket import FULL, Bucket, BucketState, adjust, debt_at, take_all, take_soonest
from proxy.limiter.verdicts import (
    LEASE_TTL,
    Spend,
    correction_spends,
    deployment_spends,
    deployment_verdict,
    key_spends,
    key_verdict,
)

Clock = Callable[[], float]
BucketId = tuple[str, ...]

SWEEP_EVERY = 60.0
"""Seconds between sweeps forgetting refilled buckets and expired leases."""


class Leases:
    """max_parallel slots: per key name, lease id -> deadline (``now + ttl``).

    Mirrors the sorted set the Redis backend keeps, expiry included: a lease whose
    deadline has passed no longer counts, so a lost release cannot leak a slot forever.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._held: dict[str, dict[str, float]] = {}

    def acquire(self, name: str, lease_id: str, limit: int, now: float) -> bool:
        held = self._held.setdefault(name, {})
        for expired in [lid for lid, deadline in held.items() if deadline < now]:
            del held[expired]
        if lease_id not in held and len(held) >= limit:
            return False
        held[lease_id] = now + self._ttl
        return True

    def release(self, name: str, lease_id: str) -> None:
        held = self._held.get(name)
        if held is not None:
            held.pop(lease_id, None)
            if not held:
                del self._held[name]

    def holds(self, name: str, lease_id: str) -> bool:
        return lease_id in self._held.get(name, {})

    def count(self, name: str) -> int:
        return len(self._held.get(name, {}))

    def sweep(self, now: float) -> None:
        for name, held in list(self._held.items()):
            for expired in [lid for lid, deadline in held.items() if deadline < now]:
                del held[expired]
            if not held:
                del self._held[name]


class MemoryLimiter:
    """A Limiter (and ManagedLimiter) keeping budgets in this process."""

    def __init__(
        self,
        clock: Clock = time.monotonic,
        *,
        lease_ttl: float = LEASE_TTL,
        sweep_every: float = SWEEP_EVERY,
    ) -> None:
        self._clock = clock
        self._buckets: dict[BucketId, tuple[BucketState, Rate]] = {}
        self._leases = Leases(lease_ttl)
        self._sweep_every = sweep_every
        self._last_sweep = clock()

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, limits: KeyLimits, lease_id: str, tokens: float) -> KeyVerdict:
        return self.acquire_key_now(limits, lease_id, tokens)

    async def release_key(self, limits: KeyLimits, lease_id: str, token_correction: float) -> None:
        self.release_key_now(limits, lease_id, token_correction)

    async def reserve_deployment(
        self,
        group: str,
        candidates: Sequence[DeploymentLimits],
        tokens: float,
        max_wait: float,
    ) -> DeploymentVerdict:
        return self.reserve_deployment_now(group, candidates, tokens, max_wait)

    async def correct_deployment(
        self, group: str, deployment: DeploymentLimits, requests: float, tokens: float
    ) -> None:
        self.correct_deployment_now(group, deployment, requests, tokens)

    async def aclose(self) -> None:
        self._buckets.clear()

    # -- ManagedLimiter --------------------------------------------------------------

    @property
    def mode(self) -> LimiterMode:
        return LimiterMode.MEMORY

    @property
    def fallback_active(self) -> bool:
        return False

    @property
    def ready(self) -> bool:
        return True

    @property
    def storage_available(self) -> bool:
        return True

    def on_mode_change(self, callback: Callable[[LimiterMode], None]) -> None:
        """The mode never changes; accepted so callers need not special-case."""

    async def start(self) -> None:
        """Nothing runs in the background."""

    # -- synchronous core (no await between reading and writing state) ----------------

    def acquire_key_now(self, limits: KeyLimits, lease_id: str, tokens: float) -> KeyVerdict:
        now = self._now()
        spends = key_spends(limits, tokens)
        ids = [_key_bucket(limits.name, s.kind) for s in spends]
        buckets = self._buckets_for(ids, spends)
        states, decision = take_all(buckets, now, 0.0)
        parallel_full = False
        if decision.allowed and limits.max_parallel is not None:
            parallel_full = not self._leases.acquire(
                limits.name, lease_id, limits.max_parallel, now
            )
        if decision.allowed and not parallel_full:
            self._store(ids, states, spends)
        else:
            states = [b.state for b in buckets]
        return key_verdict(spends, decision, parallel_full, states, now)

    def release_key_now(self, limits: KeyLimits, lease_id: str, token_correction: float) -> None:
        now = self._now()
        self._leases.release(limits.name, lease_id)
        if limits.tpm is not None and token_correction != 0:
            self._adjust(_key_bucket(limits.name, "tpm"), limits.tpm, token_correction, now)

    def reserve_deployment_now(
        self,
        group: str,
        candidates: Sequence[DeploymentLimits],
        tokens: float,
        max_wait: float,
    ) -> DeploymentVerdict:
        now = self._now()
        spends = [deployment_spends(c, tokens) for c in candidates]
        ids = [
            [_deployment_bucket(group, c.id, s.kind) for s in ss]
            for c, ss in zip(candidates, spends, strict=True)
        ]
        choice = take_soonest(
            [self._buckets_for(i, ss) for i, ss in zip(ids, spends, strict=True)], now, max_wait
        )
        if choice.index >= 0:
            self._store(ids[choice.index], choice.states, spends[choice.index])
        return deployment_verdict(candidates, choice)

    def correct_deployment_now(
        self, group: str, deployment: DeploymentLimits, requests: float, tokens: float
    ) -> None:
        now = self._now()
        for s in correction_spends(deployment, requests, tokens):
            self._adjust(_deployment_bucket(group, deployment.id, s.kind), s.rate, s.amount, now)

    def holds_lease(self, name: str, lease_id: str) -> bool:
        """Whether ``lease_id`` is a slot held here (the fallback policy routes releases)."""
        return self._leases.holds(name, lease_id)

    def leases_held(self, name: str) -> int:
        return self._leases.count(name)

    def bucket_count(self) -> int:
        return len(self._buckets)

    # -- state -----------------------------------------------------------------------

    def _now(self) -> float:
        now = self._clock()
        if now - self._last_sweep >= self._sweep_every:
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        # A bucket whose debt has drained to exactly 0 behaves like FULL from now on.
        for bucket_id, (state, rate) in list(self._buckets.items()):
            if debt_at(state, rate.interval, now) == 0:
                del self._buckets[bucket_id]
        self._leases.sweep(now)
        self._last_sweep = now

    def _buckets_for(self, ids: Sequence[BucketId], spends: Sequence[Spend]) -> list[Bucket]:
        return [Bucket(self._state(i), s.rate, s.amount) for i, s in zip(ids, spends, strict=True)]

    def _state(self, bucket_id: BucketId) -> BucketState:
        entry = self._buckets.get(bucket_id)
        return FULL if entry is None else entry[0]

    def _store(
        self, ids: Sequence[BucketId], states: Sequence[BucketState], spends: Sequence[Spend]
    ) -> None:
        for i, state, s in zip(ids, states, spends, strict=True):
            self._buckets[i] = (state, s.rate)

    def _adjust(self, bucket_id: BucketId, rate: Rate, units: float, now: float) -> None:
        self._buckets[bucket_id] = (adjust(self._state(bucket_id), rate, units, now), rate)


def _key_bucket(name: str, kind: str) -> BucketId:
    return ("key", name, kind)


def _deployment_bucket(group: str, deployment_id: str, kind: str) -> BucketId:
    return ("deployment", group, deployment_id, kind)
