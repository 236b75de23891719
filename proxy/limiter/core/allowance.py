"""Local allowances: budget leased from the shared buckets ahead of the requests (pure).

Far from its limits, a window needs no round trip per request: a replica *leases* a few
requests' worth of it (``amount`` units) in one step, admits its own requests from the
lease without asking, and gives back what it did not use. Near a limit nothing is
leased: every request asks the shared bucket, as before, so the last units of a window
go one by one to whichever replica asks first.

**Why a lease never lets more through than the bucket.** A lease is charged as one
request of ``amount`` units arriving at the end of its ``hold`` (``bucket.charge`` with
``wait = hold``: the debt becomes ``max(debt, hold / interval) + amount``), and its units
may be used at any moment before then. Using units *earlier* than they were charged is
what a reservation already allows the bucket to check: every other request admitted
meanwhile saw a debt that counts the whole lease, and because the debt was raised to at
least ``hold / interval`` it cannot drain to zero (and lose the lease's units to the
floor) before the hold ends. So at every admission the debt the requests really make is
at most the one the bucket holds, which is at most its capacity
(tests/limiter/test_allowance.py checks this on random histories).

**Giving back.** Until its hold ends, the last lease taken from a bucket may return the
units it did not use, as a reserved turn nobody used is given back, but never the refill
its hold raised the debt to. A lease taken after it may count on all of that: the debt it
found (the earlier lease's units too) may be what covered its own hold (``max`` took the
debt, not the hold), and a give-back under it would let the debt drain to zero before
its hold ends and forget its units. So a lease with another taken after it gives nothing
back: each bucket keeps the debt its last lease left (``Allowance.marks``), and only the
lease that left it is the last. Alone, a replica's leases are each the last: what the
shared bucket holds after a give-back is what this replica really used, charged at the
end of the hold, at most ``hold / interval`` units more than the exact debt, and for no
longer than the hold. After its hold a lease gives nothing back (its units may already
have drained): nothing is ever refunded late.

**Refunds.** A request's settlement may give back what it over-asked (``bucket.adjust``
with negative units), but a lease taken while that over-ask sat in the bucket may have
counted on it for its hold, as on an earlier lease's units. So each bucket keeps a
*floor*: the debt its leases alone would have made (``lease_floor``: each charged as the
bucket was, a last lease's give-back taken off both). The bucket's debt is never below
it, and a refund stops at it (``adjust``'s ``floor``): every lease's refill stays until
its hold ends, its units until they drain after it. A refund once every lease has
drained comes back whole, as without leases.

**Leasing only far from the limit.** A window is leased from only while it stays at most
``FULL_AT`` of its capacity after the lease, one lease takes at most ``SHARE`` of its
capacity, and ``hold`` is as long as the bucket has room for (``hold / interval`` units),
at most ``HOLD``, and its refill at most ``HOLD_SHARE`` of the capacity. A window too
small for ``MIN_REQUESTS`` requests in one share is never leased from, nor are paced
deployments (a burst of one cannot hold a lease).

``lua/lease.lua`` mirrors ``lease_hold``, ``lease_refund`` and ``lease_floor`` line by line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.limiter.base import Rate
from proxy.limiter.core.bucket import BucketState, adjust, debt_at

HOLD = 0.5  # the longest a lease holds (storage time)
HOLD_MIN = 0.005  # a lease that could hold less is not taken
USE_SHARE = 0.75  # a lease is used for at most this share of its hold (returned in time)
FULL_AT = 0.75  # leased from only while each window stays at most 3/4 full after it
HOLD_SHARE = 0.5  # a hold reserves at most this share of a window's capacity in refill
SHARE = 1.0 / 32.0  # one lease takes at most this share of a window's capacity
MIN_REQUESTS = 2  # ... and at least this many requests' worth, or none is taken
FIRST_REQUESTS = 8  # a first lease's size, in requests; it doubles while used up...
MAX_REQUESTS = 1024  # ... up to this
REFUSED_FOR = 1.0  # after a refused lease, ask per request for this long


def lease_hold(debts: Sequence[float], amounts: Sequence[float], rates: Sequence[Rate]) -> float:
    """How long a lease of ``amounts`` may hold over windows whose debts are ``debts``
    now (0.0: none may be taken): each window stays at most ``FULL_AT`` full with the
    lease and its hold's refill charged, and the refill is at most ``HOLD_SHARE`` of it
    (so that other replicas' leases still fit: theirs reuse it)."""
    hold = HOLD
    for debt, amount, rate in zip(debts, amounts, rates, strict=True):
        room = FULL_AT * rate.capacity - amount
        if debt > room:
            return 0.0
        hold = min(hold, min(room, HOLD_SHARE * rate.capacity) * rate.interval)
    return hold if hold >= HOLD_MIN else 0.0


def lease_refund(amount: float, used: float, hold: float, age: float, last: bool) -> float:
    """What a lease of ``amount`` units granted ``age`` seconds ago, of which its requests
    used ``used``, gives back to one window: the rest, until its hold is over, if it is
    still the ``last`` lease taken from it (none taken since may count on its units)."""
    if age > hold or not last:
        return 0.0
    return max(0.0, amount - used)


def lease_floor(
    floor: BucketState, rate: Rate, hold: float, amount: float, now: float
) -> BucketState:
    """The debt a bucket's leases count on after one more (``amount`` holding ``hold``):
    the bucket's own charge (``bucket.charge`` with the hold as the wait) made to a bucket
    that only leases charge, ``floor``. Refunds never take the bucket below it (the
    ``floor`` of ``bucket.adjust``); a lease's give-back lowers both alike."""
    return BucketState(max(debt_at(floor, rate.interval, now), hold / rate.interval) + amount, now)


def lease_size(
    requests: int, costs: Sequence[float], rates: Sequence[Rate], per_request: Sequence[float]
) -> tuple[int, list[float]] | None:
    """How many requests to lease for (about ``requests``) and the units per window,
    the first costing ``costs`` and each later one ``per_request`` (None: the windows
    are too small to lease from: not even ``MIN_REQUESTS`` fit in one share)."""
    n = float(requests)
    for cost, per, rate in zip(costs, per_request, rates, strict=True):
        if per > 0.0:
            n = min(n, math.floor((SHARE * rate.capacity - cost) / per) + 1.0)
        elif cost > SHARE * rate.capacity:
            return None
    if n < MIN_REQUESTS:
        return None
    amounts = [cost + (n - 1.0) * per for cost, per in zip(costs, per_request, strict=True)]
    return int(n), amounts


class Allowance:
    """One lease as its replica uses it: what it holds per window, what is used, and
    (``track``) a local bucket per window (from the debt before the lease, charged with
    each request admitted from it: the exact debt as if no other replica took part, what
    a key's x-ratelimit headers show), in local time.

    ``marks`` are the debts the grant left in the shared buckets (``bucket.charge``'s, as
    of ``at``): a bucket still holding its lease's mark has had no lease taken since.
    ``serial`` tells one lease from the next; ``until`` is the last local moment it
    admits (a share of its hold, counted from before the storage granted it); it admits
    ``turns`` requests at most, a deployment's numbered from ``sequence`` in its health's
    period (health.counted)."""

    __slots__ = (
        "amounts",
        "asked",
        "at",
        "closed",
        "epoch",
        "hold",
        "marks",
        "rates",
        "sequence",
        "serial",
        "states",
        "turns",
        "until",
        "used",
        "uses",
    )

    def __init__(
        self,
        serial: int,
        rates: Sequence[Rate],
        amounts: Sequence[float],
        debts: Sequence[float],
        at: float,
        hold: float,
        asked: float,
        received: float,
        turns: int,
        epoch: int = 0,
        sequence: int = 0,
        *,
        track: bool = True,
    ) -> None:
        self.serial = serial
        self.turns = turns
        self.sequence = sequence
        self.rates = tuple(rates)
        self.amounts = tuple(amounts)
        self.at = at  # storage time of the grant
        self.hold = hold
        self.marks = tuple(
            max(d, hold / r.interval) + a for d, r, a in zip(debts, rates, amounts, strict=True)
        )
        self.epoch = epoch  # a deployment's learning epoch when granted
        # Local time: the hold counts from before the grant (``asked``), the local
        # buckets from after it (``received``): both err on the safe side.
        self.asked = asked
        self.until = asked + hold * USE_SHARE
        # Only a key's requests show them (x-ratelimit headers): a deployment keeps none.
        self.states = [BucketState(d, received) for d in debts] if track else None
        self.used = [0.0] * len(self.amounts)
        self.uses = 0
        self.closed = False

    def covers(self, costs: Sequence[float], now: float) -> bool:
        """Whether a request costing ``costs`` may be admitted from it now."""
        if self.closed or now >= self.until or self.uses >= self.turns:
            return False
        for used, cost, amount in zip(self.used, costs, self.amounts, strict=True):
            if used + cost > amount:
                return False
        return True

    def take(self, costs: Sequence[float], now: float) -> None:
        """Admit a request costing ``costs`` (``covers`` said yes)."""
        self.uses += 1
        states = self.states
        for i, cost in enumerate(costs):
            self.used[i] += cost
            if states is not None:
                states[i] = adjust(states[i], self.rates[i], cost, now)

    def correct(self, units: Sequence[float], now: float) -> list[float] | None:
        """Correct a request admitted from it by ``units`` per window (negative: a
        refund), while it is open: what it cannot hold goes to the shared bucket (the
        returned excess per window). None when it is closed: correct the shared bucket."""
        if self.closed:
            return None
        excess = [0.0] * len(units)
        for i, u in enumerate(units):
            if u == 0.0:
                continue
            used = self.used[i] + u
            if used > self.amounts[i]:
                excess[i] = used - self.amounts[i]
                used = self.amounts[i]
            self.used[i] = max(0.0, used)
            if self.states is not None:
                self.states[i] = adjust(self.states[i], self.rates[i], u, now)
        return excess

    def next_size(self, requests: int, now: float) -> int:
        """The next lease's size in requests: doubled when this one was used up before
        its time, halved when it went mostly unused."""
        if now < self.until:
            return min(MAX_REQUESTS, requests * 2)
        if self.uses * 4 < requests:
            return max(MIN_REQUESTS, requests // 2)
        return requests


__all__ = [
    "FIRST_REQUESTS",
    "FULL_AT",
    "HOLD",
    "HOLD_SHARE",
    "MAX_REQUESTS",
    "MIN_REQUESTS",
    "REFUSED_FOR",
    "SHARE",
    "Allowance",
    "lease_floor",
    "lease_hold",
    "lease_refund",
    "lease_size",
]
