"""The in-memory backend: the pure core over a dict, for one process.

Safe under concurrency within one event loop because every operation reads, decides and
writes without awaiting in between (the async methods only wrap synchronous ones). Not
shared between processes: with N workers each holds 1/N of every budget, which is the
caller's job (it passes divided rates). Idle state is forgotten once it is equivalent to
a full bucket (or a healthy deployment, see ``health.expires_at``), so memory stays
bounded by the number of live keys and deployments.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from proxy.limiter import bucket, health
from proxy.limiter.base import (
    NO_CHANGE,
    DeploymentLimits,
    DeploymentState,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    KeyAsk,
    KeySettlement,
    KeyVerdict,
    LimiterMode,
    Rate,
    Settlement,
    Window,
)
from proxy.limiter.bucket import (
    FULL,
    Bucket,
    BucketState,
    adjust,
    debt_at,
    remaining_now,
    take_all,
)
from proxy.limiter.health import HEALTHY, MIN_FACTOR, Health
from proxy.limiter.selection import Candidate, select
from proxy.limiter.verdicts import (
    LEASE_TTL,
    Spend,
    corrections,
    deployment_verdict,
    floors,
    in_flight_deadline,
    key_verdict,
    probe_timeout,
    spends,
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

    def put(self, name: str, lease_id: str, deadline: float) -> None:
        """Hold ``lease_id`` until ``deadline`` whatever the limit (in-flight counts)."""
        self._held.setdefault(name, {})[lease_id] = deadline

    def live(self, name: str, now: float) -> int:
        """Leases not yet expired at ``now``."""
        return sum(1 for deadline in self._held.get(name, {}).values() if deadline >= now)

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
        # Each bucket with the interval it is swept at: the slowest it may ever refill.
        self._buckets: dict[BucketId, tuple[BucketState, float]] = {}
        self._leases = Leases(lease_ttl)
        # Per (group, deployment): its health and when it may be forgotten.
        self._health: dict[tuple[str, str], tuple[Health, float]] = {}
        self._in_flight = Leases(0.0)  # per deployment: lease id -> deadline
        self._sweep_every = sweep_every
        self._last_sweep = clock()

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict:
        return self.acquire_key_now(ask)

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        return self.reserve_now(ask)

    async def settle(self, settlement: Settlement) -> HealthChange:
        return self.settle_now(settlement)

    async def snapshot(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        return self.snapshot_now(group, deployments)

    async def aclose(self) -> None:
        self._buckets.clear()
        self._health.clear()

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

    def on_storage_error(self, callback: Callable[[str], None]) -> None:
        """There is no shared storage to fail; accepted so callers need not special-case."""

    async def start(self) -> None:
        """Nothing runs in the background."""

    # -- synchronous core (no await between reading and writing state) ----------------

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict:
        now = self._now()
        limits = ask.limits
        spent = spends(limits.windows, 1.0, ask.tokens)
        ids = [_key_bucket(limits.name, s.window) for s in spent]
        buckets = self._buckets_for(ids, spent)
        states, decision = take_all(buckets, now, 0.0)
        parallel_full = False
        if decision.allowed and limits.max_parallel is not None:
            parallel_full = not self._leases.acquire(
                limits.name, ask.lease, limits.max_parallel, now
            )
        if decision.allowed and not parallel_full:
            self._store(ids, states, spent)
        else:
            states = [b.state for b in buckets]
        return key_verdict(spent, decision, parallel_full, states, now)

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict:
        now = self._now()
        group, candidates = ask.group, ask.candidates
        spent = [spends(c.windows, 1.0, ask.tokens) for c in candidates]
        ids = [
            [_deployment_bucket(group, c.id, s.window) for s in ss]
            for c, ss in zip(candidates, spent, strict=True)
        ]
        healths = [self._health_of(group, c.id, now) for c in candidates]
        offered = [
            Candidate(
                self._buckets_for(i, ss, health.rate_factor(h, now)),
                h,
                self._in_flight.live(_deployment(group, c.id), now) if ask.least_busy else 0,
            )
            for c, i, ss, h in zip(candidates, ids, spent, healths, strict=True)
        ]
        selection = select(offered, now, ask.max_wait, ask.least_busy)
        if selection.index >= 0:
            chosen = candidates[selection.index]
            wait = selection.decision.wait
            self._store(ids[selection.index], selection.states, spent[selection.index])
            if selection.probe:
                probe = health.start_probe(
                    healths[selection.index], now, probe_timeout(chosen, wait), ask.lease
                )
                self._store_health(group, chosen.id, probe, 0.0)
            if ask.lease and ask.least_busy:  # only least-busy counts requests in flight
                deadline = in_flight_deadline(chosen, wait, now)
                self._in_flight.put(_deployment(group, chosen.id), ask.lease, deadline)
        return deployment_verdict(candidates, selection)

    def settle_now(self, settlement: Settlement) -> HealthChange:
        now = self._now()
        if isinstance(settlement, KeySettlement):
            self._settle_key(settlement, now)
            return NO_CHANGE
        s = settlement
        deployment = s.deployment
        if s.lease:
            self._in_flight.release(_deployment(s.group, deployment.id), s.lease)
        h = self._health_of(s.group, deployment.id, now)
        factor = health.rate_factor(h, now)
        for spend in corrections(deployment.windows, s.requests, s.tokens):
            bucket_id = _deployment_bucket(s.group, deployment.id, spend.window)
            self._adjust(bucket_id, spend.rate, spend.amount, now, factor)
        for f in floors(deployment, s.remaining):
            bucket_id = _deployment_bucket(s.group, deployment.id, f.window)
            rate = f.window.rate
            lowered = bucket.lower(self._state(bucket_id), rate, f.available, now, factor, f.wait)
            if lowered is not None:
                self._buckets[bucket_id] = (lowered, _slowest(bucket_id, rate))
        settled, change = health.settle(h, s.outcome, s.rule, now, s.lease)
        if settled is not h:
            self._store_health(s.group, deployment.id, settled, s.rule.window)
        return change

    def snapshot_now(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        now = self._now()
        states = {}
        for d in deployments:
            h = self._health_of(group, d.id, now)
            factor = health.rate_factor(h, now)
            remaining = {
                w.name: remaining_now(
                    self._state(_deployment_bucket(group, d.id, w)), w.rate, now, factor
                )
                for w in d.windows
            }
            states[d.id] = DeploymentState(health.unusable_for(h, now), remaining)
        return states

    def holds_in_flight(self, group: str, deployment_id: str, lease_id: str) -> bool:
        """Whether ``lease_id`` is in flight here (the fallback policy routes settlements)."""
        return self._in_flight.holds(_deployment(group, deployment_id), lease_id)

    def in_flight(self, group: str, deployment_id: str) -> int:
        return self._in_flight.live(_deployment(group, deployment_id), self._clock())

    def health_of(self, group: str, deployment_id: str) -> Health:
        """The deployment's health as stored here now (for tests and inspection)."""
        return self._health_of(group, deployment_id, self._clock())

    def holds_lease(self, name: str, lease_id: str) -> bool:
        """Whether ``lease_id`` is a slot held here (the fallback policy routes releases)."""
        return self._leases.holds(name, lease_id)

    def leases_held(self, name: str) -> int:
        return self._leases.count(name)

    def bucket_count(self) -> int:
        return len(self._buckets)

    # -- state -----------------------------------------------------------------------

    def _settle_key(self, s: KeySettlement, now: float) -> None:
        self._leases.release(s.limits.name, s.lease)
        for spend in corrections(s.limits.windows, 0.0, s.tokens):
            self._adjust(_key_bucket(s.limits.name, spend.window), spend.rate, spend.amount, now)

    def _now(self) -> float:
        now = self._clock()
        if now - self._last_sweep >= self._sweep_every:
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        # A bucket whose debt has drained to exactly 0 behaves like FULL from now on (at
        # its slowest rate, so also at any rate it may refill at later).
        for bucket_id, (state, slowest) in list(self._buckets.items()):
            if debt_at(state, slowest, now) == 0:
                del self._buckets[bucket_id]
        for deployment, (_, expires) in list(self._health.items()):
            if now >= expires:
                del self._health[deployment]
        self._leases.sweep(now)
        self._in_flight.sweep(now)
        self._last_sweep = now

    def _buckets_for(
        self, ids: Sequence[BucketId], spent: Sequence[Spend], factor: float = 1.0
    ) -> list[Bucket]:
        return [
            Bucket(self._state(i), s.rate, s.amount, factor)
            for i, s in zip(ids, spent, strict=True)
        ]

    def _state(self, bucket_id: BucketId) -> BucketState:
        entry = self._buckets.get(bucket_id)
        return FULL if entry is None else entry[0]

    def _store(
        self, ids: Sequence[BucketId], states: Sequence[BucketState], spent: Sequence[Spend]
    ) -> None:
        for i, state, s in zip(ids, states, spent, strict=True):
            self._buckets[i] = (state, _slowest(i, s.rate))

    def _adjust(
        self, bucket_id: BucketId, rate: Rate, units: float, now: float, factor: float = 1.0
    ) -> None:
        state = adjust(self._state(bucket_id), rate, units, now, factor)
        self._buckets[bucket_id] = (state, _slowest(bucket_id, rate))

    def _health_of(self, group: str, deployment_id: str, now: float) -> Health:
        entry = self._health.get((group, deployment_id))
        if entry is None:
            return HEALTHY
        h, expires = entry
        if now >= expires:
            del self._health[(group, deployment_id)]
            return HEALTHY
        return h

    def _store_health(self, group: str, deployment_id: str, h: Health, window: float) -> None:
        expires = health.expires_at(h, window)
        if expires == -math.inf:
            self._health.pop((group, deployment_id), None)
        else:
            self._health[(group, deployment_id)] = (h, expires)


def _key_bucket(name: str, window: Window) -> BucketId:
    return ("key", name, window.name)


def _deployment_bucket(group: str, deployment_id: str, window: Window) -> BucketId:
    return ("deployment", group, deployment_id, window.name)


def _deployment(group: str, deployment_id: str) -> str:
    return f"{group}\n{deployment_id}"


def _slowest(bucket_id: BucketId, rate: Rate) -> float:
    """The longest interval a bucket may refill at: a deployment's rate may be lowered to
    MIN_FACTOR of the configured one by 429s."""
    return rate.interval / MIN_FACTOR if bucket_id[0] == "deployment" else rate.interval
