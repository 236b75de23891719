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
from bisect import insort
from collections.abc import Callable, Mapping, Sequence

from proxy.limiter.base import (
    NO_CHANGE,
    TEAM,
    Activity,
    Claimant,
    DeploymentLimits,
    DeploymentState,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    KeyState,
    KeyVerdict,
    LimiterMode,
    Quota,
    Sent,
    Settlement,
    Window,
)
from proxy.limiter.core import bucket, edge, health, periods, quota
from proxy.limiter.core.bucket import (
    FULL,
    Bucket,
    BucketState,
    adjust,
    debt_at,
    take_all,
)
from proxy.limiter.core.fairness import FairView, Waiter, waiting_until
from proxy.limiter.core.health import HEALTHY, Health
from proxy.limiter.core.quota import EMPTY, QuotaCheck, QuotaState
from proxy.limiter.core.selection import Candidate, Selection, select
from proxy.limiter.core.verdicts import (
    LEARNED,
    LEASE_TTL,
    QUOTA_ALLOWED,
    Spend,
    corrections,
    deployment_state,
    deployment_verdict,
    evidence,
    floors,
    in_flight_deadline,
    key_spends,
    key_state,
    key_verdict,
    learning_windows,
    pacing_windows,
    probe_timeout,
    quota_costs,
    spends,
    with_learned,
)

Clock = Callable[[], float]
BucketId = tuple[str, ...]

SWEEP_EVERY = 60.0
"""Seconds between sweeps forgetting refilled buckets and expired leases."""


class Slots:
    """Ids held per name until a deadline (``now + ttl``): a key's max_parallel slots,
    a deployment's requests in flight.

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
        """Ids not yet expired at ``now``."""
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
        wall: Clock | None = None,
    ) -> None:
        self._clock = clock
        # Budgets' periods are on the calendar: UTC seconds (the injected clock in tests).
        self._wall = wall or (time.time if clock is time.monotonic else clock)
        # Per (scope, owner, budget name): its state and its budget (to sweep past periods).
        self._quotas: dict[tuple[str, str, str], tuple[QuotaState, Quota]] = {}
        # Each bucket with the interval it was last used at (it is swept when drained).
        self._buckets: dict[BucketId, tuple[BucketState, float]] = {}
        self._slots = Slots(lease_ttl)  # per key name
        self._team_slots = Slots(lease_ttl)  # per team name
        # Per (group, deployment): its health and when it may be forgotten.
        self._health: dict[tuple[str, str], tuple[Health, float]] = {}
        self._in_flight = Slots(0.0)  # per deployment: lease id -> deadline
        # Fair share (fairness.py), per group: each key's committed turns ahead, and the
        # keys waiting without a turn.
        self._held: dict[tuple[str, str], list[float]] = {}
        self._waiting: dict[str, dict[str, Waiter]] = {}
        self._sweep_every = sweep_every
        self._last_sweep = clock()
        self._activity: Callable[[], Activity] | None = None

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict:
        return self.acquire_key_now(ask)

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        return self.reserve_now(ask)

    async def settle(self, settlement: Settlement) -> HealthChange:
        return self.settle_now(settlement)

    def settle_soon(self, settlement: KeySettlement) -> bool:
        self.settle_now(settlement)
        return True

    async def snapshot(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        return self.snapshot_now(group, deployments)

    async def key_snapshot(self, limits: KeyLimits) -> KeyState:
        return self.key_snapshot_now(limits)

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

    def on_eviction_policy(self, callback: Callable[[bool], None]) -> None:
        """Nothing is stored in Redis; accepted so callers need not special-case."""

    async def start(self) -> None:
        """Nothing runs in the background."""

    def publish(self, source: Callable[[], Activity]) -> None:
        self._activity = source

    def share_pacing(
        self, own: Callable[[], float | None], heard: Callable[[Mapping[str, float]], None]
    ) -> None:
        """Nothing is shared: this process's margin is the only one."""

    async def activity(self) -> list[Activity]:
        """Only this process's: nothing is shared."""
        return [] if self._activity is None else [self._activity()]

    # -- synchronous core (no await between reading and writing state) ----------------

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict:
        now = self._now()
        limits = ask.limits
        spent = key_spends(limits, ask.cost)
        ids = _key_buckets(limits)
        buckets = self._buckets_for(ids, spent)
        states, decision = take_all(buckets, now, 0.0)
        quotas = limits.all_quotas
        wall, budget = now, QUOTA_ALLOWED  # the usual key: no budget
        before: list[QuotaState] = []
        charged: list[QuotaState] = []
        cap = 0
        if quotas:
            wall = self._wall()
            before = [self._quota(q) for q in quotas]
            charged, budget, cap = _check_budgets(ask, before, wall)
        full = ""
        admitted = decision.allowed and budget.allowed
        if admitted and limits.slotted:
            full = self._take_slots(limits, ask.slot, now)
        if admitted and not full:
            self._store(ids, states, spent)
            for q, state in zip(quotas, charged, strict=True):
                self._quotas[_quota_id(q)] = (state, q)
        else:
            states = [b.state for b in buckets]
            charged = before
        return key_verdict(
            spent,
            decision,
            full,
            states,
            now,
            len(limits.windows),
            quotas,
            charged,
            budget,
            wall,
            cap,
        )

    def _take_slots(self, limits: KeyLimits, lease_id: str, now: float) -> str:
        """A parallel slot of every owner with ``max_parallel`` (the key's, its team's),
        or none: the scope whose slots are full ("" when every owner had one)."""
        taken: list[KeyLimits] = []
        for owner in limits.owners:
            if owner.max_parallel is None:
                continue
            slots = self._slots_of(owner)
            if not slots.acquire(owner.name, lease_id, owner.max_parallel, now):
                for held in taken:
                    self._slots_of(held).release(held.name, lease_id)
                return owner.scope
            taken.append(owner)
        return ""

    def _slots_of(self, owner: KeyLimits) -> Slots:
        return self._team_slots if owner.scope == TEAM else self._slots

    def reserve_on_renewal(self, ask: GroupAsk) -> None:
        """Never: every reservation is answered at once (``reserve_now``)."""
        return None

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict:
        now = self._now()
        group, candidates = ask.group, ask.candidates
        healths = [self._health_of(group, c.id, now) for c in candidates]
        spent = [
            with_learned(spends(c.windows, ask.cost), h, now)
            for c, h in zip(candidates, healths, strict=True)
        ]
        ids = [
            [_deployment_bucket(group, c.id, s.window) for s in ss]
            for c, ss in zip(candidates, spent, strict=True)
        ]
        offered = [
            Candidate(
                self._buckets_for(i, ss),
                h,
                self._in_flight.live(_deployment(group, c.id), now) if ask.least_busy else 0,
            )
            for c, i, ss, h in zip(candidates, ids, spent, healths, strict=True)
        ]
        fair = self._fair_view(ask, now)
        selection = select(offered, now, ask.max_wait, ask.least_busy, fair)
        if fair is not None:
            self._record_fairness(group, fair.claimant, selection, now)
        sent = None
        if selection.index >= 0:
            chosen = candidates[selection.index]
            wait = selection.decision.wait
            self._store(ids[selection.index], selection.states, spent[selection.index])
            h = healths[selection.index]
            if selection.probe:
                h = health.start_probe(h, now, probe_timeout(chosen, wait), ask.slot)
            h = health.counted(h, now + wait)
            self._store_health(group, chosen.id, h, None)
            sent = Sent(h.epoch, h.sent, now + wait)
            if ask.slot and ask.least_busy:  # only least-busy counts requests in flight
                deadline = in_flight_deadline(chosen, wait, now)
                self._in_flight.put(_deployment(group, chosen.id), ask.slot, deadline)
        return deployment_verdict(candidates, selection, sent)

    def _fair_view(self, ask: GroupAsk, now: float) -> FairView | None:
        if ask.claimant is None or ask.lookahead <= 0.0:
            return None
        held = self._held.get((ask.group, ask.claimant.key), [])
        while held and held[0] <= now:
            held.pop(0)
        waiting = self._waiting.get(ask.group, {})
        for key in [k for k, w in waiting.items() if w.until <= now]:
            del waiting[key]
        # No copies: select reads them before anything here changes them.
        return FairView(ask.claimant, held, waiting, ask.lookahead)

    def _record_fairness(
        self, group: str, claimant: Claimant, selection: Selection, now: float
    ) -> None:
        """A deferred key waits; a key that got a turn ahead holds it and stops waiting."""
        if selection.deferral is not None:
            until = waiting_until(selection.deferral, now)
            waiter = Waiter(claimant.tier, claimant.weight, until)
            self._waiting.setdefault(group, {})[claimant.key] = waiter
        elif selection.index >= 0:
            waiting = self._waiting.get(group)
            if waiting is not None:
                waiting.pop(claimant.key, None)
                if not waiting:
                    del self._waiting[group]
            if selection.decision.wait > 0.0:
                turn = now + selection.decision.wait
                insort(self._held.setdefault((group, claimant.key), []), turn)

    def settle_now(self, settlement: Settlement) -> HealthChange:
        now = self._now()
        if isinstance(settlement, KeySettlement):
            self._settle_key(settlement, now)
            return NO_CHANGE
        s = settlement
        group, deployment = s.group, s.deployment
        if s.slot:
            self._in_flight.release(_deployment(group, deployment.id), s.slot)
        h = self._health_of(group, deployment.id, now)
        for spend in corrections(deployment.windows, s.cost):
            self._adjust(_deployment_bucket(group, deployment.id, spend.window), spend, now)
        for f in floors(deployment, s.remaining, s.rule.max_hold):
            bucket_id = _deployment_bucket(group, deployment.id, f.window)
            rate = f.window.rate
            lowered = bucket.lower(self._state(bucket_id), rate, f.available, now, f.wait)
            if lowered is not None:
                self._buckets[bucket_id] = (lowered, rate.interval)
        if s.private.hold > 0.0:
            for w in pacing_windows(deployment):
                bucket_id = _deployment_bucket(group, deployment.id, w)
                kept = bucket.held_at_least(self._state(bucket_id), w.rate, s.private.hold, now)
                if kept is not None:
                    self._buckets[bucket_id] = (kept, w.rate.interval)
        settled, change = health.settle(
            h, s.outcome, s.rule, now, s.slot, evidence(deployment, s.sent)
        )
        if settled.epoch != h.epoch:  # learned: turns past the hold are taken again
            hold = health.hold_for(settled, now)
            for w in learning_windows(deployment, settled, now):
                bucket_id = _deployment_bucket(group, deployment.id, w)
                self._buckets[bucket_id] = (bucket.held(w.rate, hold, now), w.rate.interval)
        if settled is not h:
            self._store_health(group, deployment.id, settled, s.rule.window)
        return change

    def snapshot_now(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        now = self._now()
        return {
            d.id: deployment_state(
                d,
                self._health_of(group, d.id, now),
                [self._state(_deployment_bucket(group, d.id, w)) for w in d.windows],
                self._state(("deployment", group, d.id, LEARNED)),
                now,
            )
            for d in deployments
        }

    def key_snapshot_now(self, limits: KeyLimits) -> KeyState:
        """The windows and slots of one owner (a key's own, or a team's)."""
        now = self._now()
        states = [self._state(_key_bucket(limits, w)) for w in limits.windows]
        budgets = [self._quota(q) for q in limits.quotas]
        slots = self._slots_of(limits).live(limits.name, now)
        return key_state(limits, states, slots, now, budgets, self._wall())

    def holds_in_flight(self, group: str, deployment_id: str, lease_id: str) -> bool:
        """Whether ``lease_id`` is in flight here (the fallback policy routes settlements)."""
        return self._in_flight.holds(_deployment(group, deployment_id), lease_id)

    def in_flight(self, group: str, deployment_id: str) -> int:
        return self._in_flight.live(_deployment(group, deployment_id), self._clock())

    def health_of(self, group: str, deployment_id: str) -> Health:
        """The deployment's health as stored here now (for tests and inspection)."""
        return self._health_of(group, deployment_id, self._clock())

    def holds_lease(self, name: str, lease_id: str) -> bool:
        """Whether ``lease_id`` is a slot of key ``name`` held here."""
        return self._slots.holds(name, lease_id)

    def holds_slot(self, limits: KeyLimits, lease_id: str) -> bool:
        """Whether ``lease_id`` is a slot of the key or of its team held here (the
        fallback policy routes releases)."""
        return any(self._slots_of(o).holds(o.name, lease_id) for o in limits.owners)

    def leases_held(self, name: str) -> int:
        return self._slots.count(name)

    def bucket_count(self) -> int:
        return len(self._buckets)

    # -- state -----------------------------------------------------------------------

    def _settle_key(self, s: KeySettlement, now: float) -> None:
        for owner in s.limits.owners:
            self._slots_of(owner).release(owner.name, s.slot)
            for spend in corrections(owner.windows, s.cost):
                self._adjust(_key_bucket(owner, spend.window), spend, now)
        quotas = s.limits.all_quotas
        if not quotas:
            return
        for q, units in zip(quotas, quota_costs(s.limits, s.budget_cost), strict=True):
            if units != 0:
                settled = quota.settle(self._quota(q), q, s.started, units)
                if settled is not None:
                    self._quotas[_quota_id(q)] = (settled, q)

    def _quota(self, q: Quota) -> QuotaState:
        entry = self._quotas.get(_quota_id(q))
        return EMPTY if entry is None else entry[0]

    def _now(self) -> float:
        now = self._clock()
        if now - self._last_sweep >= self._sweep_every:
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        # A bucket whose debt has drained to exactly 0 behaves like FULL from now on (a
        # learned rate only grows; one a reload lowered drains slower from its next use,
        # so until then it may be forgotten early: in the client's favour, never against).
        for bucket_id, (state, slowest) in list(self._buckets.items()):
            if debt_at(state, slowest, now) == 0:
                del self._buckets[bucket_id]
        wall = self._wall()
        for quota_id, (spent, q) in list(self._quotas.items()):
            if spent.period < periods.index(q.period, wall):  # a past period: reads as EMPTY
                del self._quotas[quota_id]
        for deployment, (_, expires) in list(self._health.items()):
            if now >= expires:
                del self._health[deployment]
        self._slots.sweep(now)
        self._in_flight.sweep(now)
        for held_id, held in list(self._held.items()):
            if not held or held[-1] <= now:
                del self._held[held_id]
        for group, waiting in list(self._waiting.items()):
            if all(w.until <= now for w in waiting.values()):
                del self._waiting[group]
        self._last_sweep = now

    def _buckets_for(self, ids: Sequence[BucketId], spent: Sequence[Spend]) -> list[Bucket]:
        get = self._buckets.get  # (_state, inlined: per window of every request)
        return [
            Bucket(FULL if (e := get(i)) is None else e[0], s.window.rate, s.amount)
            for i, s in zip(ids, spent, strict=True)
        ]

    def _state(self, bucket_id: BucketId) -> BucketState:
        entry = self._buckets.get(bucket_id)
        return FULL if entry is None else entry[0]

    def _store(
        self, ids: Sequence[BucketId], states: Sequence[BucketState], spent: Sequence[Spend]
    ) -> None:
        for i, state, s in zip(ids, states, spent, strict=True):
            self._buckets[i] = (state, s.window.rate.interval)

    def _adjust(self, bucket_id: BucketId, spend: Spend, now: float) -> None:
        rate = spend.window.rate
        state = adjust(self._state(bucket_id), rate, spend.amount, now)
        self._buckets[bucket_id] = (state, rate.interval)

    def _health_of(self, group: str, deployment_id: str, now: float) -> Health:
        entry = self._health.get((group, deployment_id))
        if entry is None:
            return HEALTHY
        h, expires = entry
        if now >= expires:
            del self._health[(group, deployment_id)]
            return HEALTHY
        return h

    def _store_health(
        self, group: str, deployment_id: str, h: Health, window: float | None
    ) -> None:
        """``window``: the cooldown rule's; None when unknown (a reservation): the stored
        expiry is then kept if it is later."""
        key = (group, deployment_id)
        expires = health.expires_at(h, window or 0.0)
        if window is None and key in self._health:
            expires = max(expires, self._health[key][1])
        if expires == -math.inf:
            self._health.pop(key, None)
        else:
            self._health[key] = (h, expires)


def _key_bucket(owner: KeyLimits, window: Window) -> BucketId:
    """A key's or a team's window (``owner.scope``): a team's windows are one bucket
    whichever of its keys asks."""
    return (owner.scope, owner.name, window.name)


def _key_buckets(limits: KeyLimits) -> list[BucketId]:
    """The buckets of every window an ask of the key touches (``KeyLimits.all_windows``)."""
    scope, name = limits.scope, limits.name
    ids: list[BucketId] = [(scope, name, w.name) for w in limits.windows]
    if limits.team is not None:
        ids += [_key_bucket(limits.team, w) for w in limits.team.windows]
    return ids


def _check_budgets(
    ask: KeyAsk, states: list[QuotaState], wall: float
) -> tuple[list[QuotaState], QuotaCheck, int]:
    """``quota.check`` of the ask's budgets (``states``, in ``all_quotas`` order) at
    ``wall``, charged its ``budget_cost``, or with a clamp at the output cap its budgets
    that clamp can pay (core/edge.py): their states if charged, the check, that cap (0:
    not lowered)."""
    quotas, cap = ask.limits.all_quotas, 0
    if ask.clamp is None:
        costs = quota_costs(ask.limits, ask.budget_cost)
    else:
        costs, cap = edge.charge(quotas, states, ask.clamp, wall)
    charged, budget = quota.check(quotas, states, costs, wall)
    return charged, budget, cap


def _quota_id(q: Quota) -> tuple[str, str, str]:
    return (q.scope, q.owner, q.name)


def _deployment_bucket(group: str, deployment_id: str, window: Window) -> BucketId:
    return ("deployment", group, deployment_id, window.name)


def _deployment(group: str, deployment_id: str) -> str:
    return f"{group}\n{deployment_id}"
