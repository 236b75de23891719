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

from proxy.limiter import bucket
from proxy.limiter.base import (
    CooldownRule,
    DeploymentLimits,
    DeploymentVerdict,
    HealthChange,
    KeyLimits,
    KeyVerdict,
    LimiterMode,
    Outcome,
    Rate,
)
from proxy.limiter.bucket import FULL, Bucket, BucketState, adjust, debt_at, take_all, usage
from proxy.limiter.selection import Candidate, select
from proxy.limiter.verdicts import (
    LEASE_TTL,
    Spend,
    correction_spends,
    deployment_spends,
    deployment_verdict,
    in_flight_deadline,
    key_spends,
    key_verdict,
    probe_timeout,
    sync_floors,
)
from proxy.routing import health
from proxy.routing.health import HEALTHY, MIN_FACTOR, Health

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
        *,
        lease_id: str = "",
        least_busy: bool = False,
    ) -> DeploymentVerdict:
        return self.reserve_deployment_now(
            group, candidates, tokens, max_wait, lease_id=lease_id, least_busy=least_busy
        )

    async def correct_deployment(
        self, group: str, deployment: DeploymentLimits, requests: float, tokens: float
    ) -> None:
        self.correct_deployment_now(group, deployment, requests, tokens)

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
        return self.settle_deployment_now(
            group,
            deployment,
            lease_id=lease_id,
            outcome=outcome,
            rule=rule,
            requests=requests,
            tokens=tokens,
        )

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
        self.sync_budget_now(
            group,
            deployment,
            remaining_requests=remaining_requests,
            reset_requests=reset_requests,
            remaining_tokens=remaining_tokens,
            reset_tokens=reset_tokens,
        )

    async def deployment_health(self, group: str, ids: Sequence[str]) -> dict[str, float]:
        return self.deployment_health_now(group, ids)

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
        *,
        lease_id: str = "",
        least_busy: bool = False,
    ) -> DeploymentVerdict:
        now = self._now()
        spends = [deployment_spends(c, tokens) for c in candidates]
        ids = [
            [_deployment_bucket(group, c.id, s.kind) for s in ss]
            for c, ss in zip(candidates, spends, strict=True)
        ]
        healths = [self._health_of(group, c.id, now) for c in candidates]
        offered = [
            Candidate(
                self._buckets_for(i, ss, health.rate_factor(h, now)),
                h,
                self._in_flight.live(_deployment(group, c.id), now) if least_busy else 0,
            )
            for c, i, ss, h in zip(candidates, ids, spends, healths, strict=True)
        ]
        selection = select(offered, now, max_wait, least_busy)
        if selection.index >= 0:
            chosen = candidates[selection.index]
            wait = selection.decision.wait
            self._store(ids[selection.index], selection.states, spends[selection.index])
            if selection.probe:
                probe = health.start_probe(
                    healths[selection.index], now, probe_timeout(chosen, wait), lease_id
                )
                self._store_health(group, chosen.id, probe, 0.0)
            if lease_id and least_busy:  # only least-busy counts requests in flight
                deadline = in_flight_deadline(chosen, wait, now)
                self._in_flight.put(_deployment(group, chosen.id), lease_id, deadline)
        return deployment_verdict(candidates, selection)

    def correct_deployment_now(
        self, group: str, deployment: DeploymentLimits, requests: float, tokens: float
    ) -> None:
        now = self._now()
        factor = health.rate_factor(self._health_of(group, deployment.id, now), now)
        self._correct(group, deployment, requests, tokens, factor, now)

    def settle_deployment_now(
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
        now = self._now()
        if lease_id:
            self._in_flight.release(_deployment(group, deployment.id), lease_id)
        h = self._health_of(group, deployment.id, now)
        self._correct(group, deployment, requests, tokens, health.rate_factor(h, now), now)
        settled, change = health.settle(h, outcome, rule, now, lease_id)
        if settled is not h:
            self._store_health(group, deployment.id, settled, rule.window)
        return change

    def sync_budget_now(
        self,
        group: str,
        deployment: DeploymentLimits,
        *,
        remaining_requests: float | None,
        reset_requests: float | None,
        remaining_tokens: float | None,
        reset_tokens: float | None,
    ) -> None:
        floors = sync_floors(deployment, remaining_requests, reset_requests, remaining_tokens)
        if not floors:
            return
        now = self._now()
        factor = health.rate_factor(self._health_of(group, deployment.id, now), now)
        for f in floors:
            bucket_id = _deployment_bucket(group, deployment.id, f.kind)
            lowered = bucket.lower(self._state(bucket_id), f.rate, f.available, now, factor, f.wait)
            if lowered is not None:
                self._buckets[bucket_id] = (lowered, _slowest(bucket_id, f.rate))

    async def deployment_budget(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, dict[str, float]]:
        return self.deployment_budget_now(group, deployments)

    def deployment_budget_now(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, dict[str, float]]:
        now = self._now()
        budget: dict[str, dict[str, float]] = {}
        for d in deployments:
            rates = {"requests": d.rpm, "tokens": d.tpm}
            budget[d.id] = {
                kind: usage(
                    self._state(_deployment_bucket(group, d.id, bucket)), rate, now
                ).remaining
                for (kind, rate), bucket in zip(rates.items(), ("rpm", "tpm"), strict=True)
                if rate is not None
            }
        return budget

    def deployment_health_now(self, group: str, ids: Sequence[str]) -> dict[str, float]:
        now = self._now()
        return {i: health.unusable_for(self._health_of(group, i, now), now) for i in ids}

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
        self, ids: Sequence[BucketId], spends: Sequence[Spend], factor: float = 1.0
    ) -> list[Bucket]:
        return [
            Bucket(self._state(i), s.rate, s.amount, factor)
            for i, s in zip(ids, spends, strict=True)
        ]

    def _state(self, bucket_id: BucketId) -> BucketState:
        entry = self._buckets.get(bucket_id)
        return FULL if entry is None else entry[0]

    def _store(
        self, ids: Sequence[BucketId], states: Sequence[BucketState], spends: Sequence[Spend]
    ) -> None:
        for i, state, s in zip(ids, states, spends, strict=True):
            self._buckets[i] = (state, _slowest(i, s.rate))

    def _adjust(
        self, bucket_id: BucketId, rate: Rate, units: float, now: float, factor: float = 1.0
    ) -> None:
        state = adjust(self._state(bucket_id), rate, units, now, factor)
        self._buckets[bucket_id] = (state, _slowest(bucket_id, rate))

    def _correct(
        self,
        group: str,
        deployment: DeploymentLimits,
        requests: float,
        tokens: float,
        factor: float,
        now: float,
    ) -> None:
        for s in correction_spends(deployment, requests, tokens):
            bucket_id = _deployment_bucket(group, deployment.id, s.kind)
            self._adjust(bucket_id, s.rate, s.amount, now, factor)

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


def _key_bucket(name: str, kind: str) -> BucketId:
    return ("key", name, kind)


def _deployment_bucket(group: str, deployment_id: str, kind: str) -> BucketId:
    return ("deployment", group, deployment_id, kind)


def _deployment(group: str, deployment_id: str) -> str:
    return f"{group}\n{deployment_id}"


def _slowest(bucket_id: BucketId, rate: Rate) -> float:
    """The longest interval a bucket may refill at: a deployment's rate may be lowered to
    MIN_FACTOR of the configured one by 429s."""
    return rate.interval / MIN_FACTOR if bucket_id[0] == "deployment" else rate.interval
