"""The pure rate-limit core: GCRA kept as a debt, with an injected clock.

A bucket's state is its *debt*: how many units of budget are spent and not yet refilled,
measured at time ``at``. The debt drains at one unit per ``rate.interval`` seconds and
never goes below zero (a full bucket). This is GCRA: the theoretical arrival time is
``at + debt * interval`` (see :meth:`BucketState.tat`). It is stored as a debt in units
rather than as a TAT because a burst then adds small exact numbers (``49 + 1 == 50``)
instead of accumulating rounding errors on an epoch-sized timestamp, so "a key allowed 50
at once passes exactly 50" holds bit for bit; and because a debt in units stays
meaningful when the configured rate changes.

A request costing ``cost`` units may go when ``debt + cost <= capacity``. When it cannot
go now, it must wait ``(debt + cost - capacity) * interval`` seconds. If that is within
``max_wait`` it gets a *reservation*: the debt is charged now and the caller sleeps until
its exact turn (no polling). Otherwise nothing is charged and ``retry_after`` says when the
same request (same cost, same ``max_wait``) would be admitted.

The state stays a debt in units, so a rate change is well defined: the debt at ``now``
is what is left after draining since ``at`` at the *current* rate (a learned rate that
grows, an operator's new limit).

``lua/bucket.lua`` is a line-by-line mirror of this module: same formulas in the same
order, so the Redis backend's floats are identical. Change both together.

Nothing here does I/O or imports redis, fastapi or httpx.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

from proxy.limiter.base import Rate, Usage
from proxy.values import value


@value
class BucketState:
    """``debt`` units spent and not yet refilled, as of time ``at`` (seconds)."""

    debt: float = 0.0
    at: float = -math.inf  # a fresh bucket has been full forever

    def tat(self, rate: Rate) -> float:
        """GCRA's theoretical arrival time, for readers who think in TATs."""
        return self.at + self.debt * rate.interval


FULL = BucketState()
"""A bucket nobody has used (or that has refilled): no debt."""


class Admission(enum.Enum):
    ALLOWED = "allowed"  # charged; go after ``wait`` seconds (0 = now)
    REFUSED = "refused"  # nothing charged; try again after ``retry_after``
    TOO_LARGE = "too_large"  # cost > capacity: can never pass, do not retry


@value
class Decision:
    admission: Admission
    wait: float = 0.0  # ALLOWED: seconds until the reserved turn
    retry_after: float = 0.0  # REFUSED: seconds until the same request would be admitted
    # Index of the bucket that decided: the one with the longest wait (REFUSED, or ALLOWED
    # with a wait) or the first too small for the cost (TOO_LARGE); -1 when none had to wait.
    binding: int = -1

    @property
    def allowed(self) -> bool:
        return self.admission is Admission.ALLOWED


@value
class Bucket:
    """One bucket taking part in a decision: its state, its rate, what this request costs."""

    state: BucketState
    rate: Rate
    cost: float

    @property
    def interval(self) -> float:
        """Seconds one unit takes to refill."""
        return self.rate.interval

    @property
    def capacity(self) -> float:
        """What this request is measured against (``Rate.capacity_for``)."""
        return self.rate.capacity_for(self.cost)


@value
class Plan:
    """What taking from a set of buckets at ``now`` would mean, before deciding."""

    debts: tuple[float, ...]  # each bucket's debt at ``now``
    wait: float  # seconds until every bucket can take its cost (0 = now)
    binding: int  # bucket with the longest wait, -1 if none waits
    too_large: int  # first bucket whose capacity is below its cost, -1 if none


def debt_at(state: BucketState, interval: float, now: float) -> float:
    """The debt left at ``now``. Before ``state.at`` (a clock that stepped back, e.g. a
    Redis failover) the debt is larger by the same formula, so the TAT is kept."""
    return max(0.0, state.debt - (now - state.at) / interval)


def plan(buckets: Sequence[Bucket], now: float) -> Plan:
    """Every bucket's wait; the request's wait is the longest (all must be able to go)."""
    debts: list[float] = []
    wait = 0.0
    binding = -1
    too_large = -1
    for i, b in enumerate(buckets):
        rate, cost = b.rate, b.cost  # (Bucket's properties spelled out: this runs per request)
        interval = rate.interval
        debt = debt_at(b.state, interval, now)
        debts.append(debt)
        capacity = rate.capacity_for(cost)
        if cost > capacity and too_large < 0:
            too_large = i
        # debt + cost - capacity is exact for whole units, so the last request of a
        # burst that exactly fills the bucket gets wait 0, not 1e-12.
        w = (debt + cost - capacity) * interval
        if w > wait:
            wait = w
            binding = i
    return Plan(tuple(debts), wait, binding, too_large)


def decide(p: Plan, max_wait: float) -> Decision:
    if p.too_large >= 0:
        return Decision(Admission.TOO_LARGE, binding=p.too_large)
    if p.wait <= max_wait:
        return Decision(Admission.ALLOWED, wait=p.wait, binding=p.binding)
    # Every bucket's wait shrinks by one second per second, so after this long the
    # longest one is exactly max_wait: the same request then gets a reservation.
    return Decision(Admission.REFUSED, retry_after=p.wait - max_wait, binding=p.binding)


def charge(buckets: Sequence[Bucket], p: Plan, now: float) -> list[BucketState]:
    """Record the request as arriving at its turn, ``now + p.wait``, in every bucket.

    A bucket that could have taken it sooner is charged as of the real send time, not
    now: its debt at the turn is ``max(0, debt - wait / interval) + cost``, which measured
    from ``now`` is ``max(debt, wait / interval) + cost``. Charging earlier would let it
    refill early and admit a later request too close behind this one.
    """
    wait = p.wait
    return [
        BucketState(max(debt, wait / b.rate.interval) + b.cost, now)
        for b, debt in zip(buckets, p.debts, strict=True)
    ]


def take_all(
    buckets: Sequence[Bucket], now: float, max_wait: float
) -> tuple[list[BucketState], Decision]:
    """All-or-nothing: every bucket is charged for the same turn, or none is."""
    p = plan(buckets, now)
    decision = decide(p, max_wait)
    if decision.allowed:
        return charge(buckets, p, now), decision
    return [b.state for b in buckets], decision


def take(
    state: BucketState, rate: Rate, cost: float, now: float, max_wait: float
) -> tuple[BucketState, Decision]:
    """One bucket: go now, reserve a turn within ``max_wait``, or be refused."""
    states, decision = take_all([Bucket(state, rate, cost)], now, max_wait)
    return states[0], decision


def adjust(
    state: BucketState, rate: Rate, units: float, now: float, floor: BucketState = FULL
) -> BucketState:
    """Add ``units`` to the debt (negative: a refund). A refund never makes the bucket
    fuller than full (the TAT never goes below ``now``), nor takes the debt below
    ``floor``'s (what the bucket's leases still count on, allowance.lease_floor), nor
    raises it to that."""
    interval = rate.interval
    debt = debt_at(state, interval, now)
    # With no floor (FULL, whose debt is 0 at any time) this is max(0.0, debt + units):
    # the plain refund, computed so without a second debt_at (a lease's take runs this).
    keep = 0.0 if floor is FULL else min(debt, debt_at(floor, interval, now))
    return BucketState(max(keep, debt + units), now)


def lower(
    state: BucketState,
    rate: Rate,
    available: float,
    now: float,
    wait: float | None = None,
) -> BucketState | None:
    """At most ``available`` units may be taken at once now, and with ``wait``, one unit
    no sooner than ``wait`` seconds from now: the debt is raised to that, never lowered.
    None when the bucket already holds no more (nothing to write)."""
    interval = rate.interval
    debt = debt_at(state, interval, now)
    # Against the capacity, not a paced bucket's ceiling: a paced bucket sends one
    # request ahead of its pace at most, so only "nothing left" must hold it back.
    floor = rate.capacity - available
    if wait is not None:
        floor = max(floor, rate.capacity - 1.0 + wait / interval)
    if floor > debt:
        return BucketState(floor, now)
    return None


def remaining_now(state: BucketState, rate: Rate, now: float) -> float:
    """Units that could be taken at once right now (0 while turns are reserved ahead;
    for a paced bucket, the largest request it could take)."""
    return max(0.0, rate.largest - debt_at(state, rate.interval, now))


def held(rate: Rate, hold: float, now: float) -> BucketState:
    """A bucket that takes nothing for ``hold`` seconds, then its next request (one unit:
    its debt is its capacity less one, plus the hold), whatever it had reserved ahead:
    turns past a learning event are taken again at the new pace (health.py)."""
    return BucketState(max(0.0, rate.capacity - 1.0) + hold / rate.interval, now)


def held_at_least(state: BucketState, rate: Rate, hold: float, now: float) -> BucketState | None:
    """``held`` unless the bucket already gives no turn sooner (None: nothing to write)."""
    target = held(rate, hold, now)
    return target if target.debt > debt_at(state, rate.interval, now) else None


def usage(state: BucketState, rate: Rate, now: float) -> Usage:
    """The bucket as x-ratelimit-* headers describe it: ``remaining`` now, and ``reset``,
    the seconds until the bucket is full again."""
    interval = rate.interval
    debt = debt_at(state, interval, now)
    # remaining_now's formula over the debt just computed (not computed twice).
    return Usage(rate.limit, max(0.0, rate.largest - debt), debt * interval)
