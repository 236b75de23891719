"""Turn leases: a paced deployment's next turns taken in one step (pure).

A deployment paced with ``burst: 1`` gives its turns exactly ``interval`` apart, so a
budget lease (allowance.py), which lets its units go at any moment before its hold ends,
cannot be taken from it. A *turn lease* keeps the pacing: in one step (``lease_turns``)
the shared buckets are charged for up to ``turns`` consecutive reservations, exactly as
that many requests asking one after another would be, and the replica then hands the
turns out itself (``TurnLease.turn``) with the same GCRA math over a local copy of the
buckets, started from their debts before the lease.

**Why exact across replicas.** The local buckets start where the shared ones stood, so a
local turn is never sooner than the turn the shared buckets would have given; a turn is
handed out only while the local buckets, charged with it, stay within what the lease
charged the shared ones (``within``: their debts at the same moment), so the last local
turn is never later than the lease's last turn. Every turn another replica reserves after
the lease is measured against the shared buckets, which count the whole lease. So in
every bucket the turns sent, all replicas together, are a history the bucket itself
would have admitted: never two turns of a paced window closer than its interval
(tests/limiter/core/test_turns.py replays random histories of several replicas, checks it).

**Giving back.** Turns a lease did not hand out go back only while nothing else touched a
bucket since the lease (``returned``: it still holds exactly what the lease left): then
it is set to the local bucket, whose turns are all that was sent. Otherwise they are
kept, and expire when their time passes (the lease reaches at most ``SPAN`` ahead).
Nothing is ever returned from a bucket another turn was charged to since: that would
put a later turn between turns already granted.

**Only far from the limit.** A lease is taken while its first turn comes within ``WAIT``
(at most one other replica's lease ahead, no longer queue of turns), nobody waits for a
fair share, and the deployment is healthy; it reaches at most ``SPAN`` past its first
turn, and a longer window (a day's) may lose at most ``SHARE`` of its capacity to it and
stay at most ``FULL_AT`` full. A replica whose requests took more than ``NEAR`` of the
deployment's turns over a lease's cycle (from asking for it to asking for the next) is
near the limit: it asks per request for ``REFUSED_FOR``; one refused for the turns ahead
of it, until they could have drained (``refused_for``). Its size follows the demand it
sees: about ``TARGET_USES`` requests per lease, and at least twice the requests the last
one served (a burst that waited for it is served whole).

Times here are *lease time*: seconds since the storage granted the lease (``at``), so the
comparisons are between small numbers, not epoch-sized ones.

``redis/lua/turns.lua`` mirrors ``lease_turns`` and ``returned`` line by line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.limiter.base import Rate
from proxy.limiter.core.allowance import FULL_AT, SHARE
from proxy.limiter.core.bucket import Bucket, BucketState, charge, debt_at, plan

SPAN = 0.005  # a lease's last turn comes at most this long after its first (seconds)
# Leased only while the first turn comes within this: at most one other replica's lease
# ahead, whose turns this one's requests wait out as they would per request behind it
# (an eighth of a span refused the second of two replicas about every other lease, and
# each refusal cost it a round trip per request for REFUSED_FOR: docs/performance.md);
# more than that is a queue of turns, near the limit.
WAIT = SPAN
MIN_TURNS = 2  # a lease of fewer turns is not taken
FIRST_TURNS = 64  # a first lease's turns; then sized by the demand...
MAX_TURNS = 512  # ... up to this
TARGET_USES = 8  # ... for about this many requests per lease
# A lease's turns counted in its deployment's health period (what a 429's learning divides
# by time): as many as it is expected to hand out, not every turn it holds, which would
# make a 429 after leases teach a rate far above the one really sent.
COUNTED = 2 * TARGET_USES
# A replica whose requests took more than this share of the deployment's turns over a
# lease's cycle is near the limit. (Measured over the cycle, not the lease's own turns:
# the requests that waited for a renewal take its first turns at once, a burst, not a
# rate.)
NEAR = 0.25
REFUSED_FOR = 0.25  # then (or when refused) ask per request for this long (seconds)
USE_SHARE = 0.75  # a lease hands out turns for this share of SPAN from its first, then renews
LONG = 60.0  # windows longer than this (seconds) cap a total: SHARE and FULL_AT bound them
DRIFT = 0.001  # seconds a second the smallest offset may rise by (as routing/turn_clock.py)
# The most a lease's time 0 is put before the grant's arrival (the default pacing margin):
# a storage clock stepping back (a failover) can make a lease's turns early by this at most.
MAX_CORRECTION = 0.05
# A first grant (no quicker reply seen on its clock) that took longer than this to come is
# not trusted: it may have been read late, and every turn of its lease would be as late.
SLOW_GRANT = 0.002


def bound(rate: Rate, debt: float) -> float:
    """The most debt a lease may leave in a window (``math.inf``: no bound but ``SPAN``):
    a window of a minute or less paces; a longer one keeps ``FULL_AT`` of its capacity
    free and loses at most ``SHARE`` of it."""
    if rate.period <= LONG:
        return math.inf
    return min(FULL_AT * rate.capacity, debt + SHARE * rate.capacity)


def worth(rates: Sequence[Rate], capacities: Sequence[float], costs: Sequence[float]) -> bool:
    """Whether ``MIN_TURNS`` turns of a request costing ``costs`` (measured against
    ``capacities``) could fit in ``SPAN`` from an idle deployment: else its turns are too
    far apart to lease (a slow deployment asks per request, without asking for a lease)."""
    for rate, capacity, cost in zip(rates, capacities, costs, strict=True):
        if rate.period <= LONG and (MIN_TURNS * cost - capacity) * rate.interval > SPAN:
            return False
    return True


def lease_turns(
    buckets: Sequence[Bucket], turns: int, bounds: Sequence[float], now: float
) -> tuple[list[BucketState], int, float, float]:
    """Up to ``turns`` reservations in a row at ``now``, each costing the buckets' costs:
    the states after them, how many were taken, and the first and last turn's waits.
    One stops before a turn more than ``SPAN`` after the first, or one that would leave a
    bucket's debt above its bound (``bound``)."""
    p = plan(buckets, now)
    first = p.wait
    if len(buckets) == 1 and p.too_large < 0:
        debt, taken, last = one_window_turns(buckets[0], p.debts[0], turns, bounds[0], first)
        return [BucketState(debt, now)], taken, first, last
    states = [BucketState(d, now) for d in p.debts]
    taken = 0
    last = first
    while taken < turns:
        current = [Bucket(s, b.rate, b.cost) for s, b in zip(states, buckets, strict=True)]
        p = plan(current, now)
        if p.too_large >= 0 or p.wait > first + SPAN:
            break
        charged = charge(current, p, now)
        if any(s.debt > limit for s, limit in zip(charged, bounds, strict=True)):
            break
        states = charged
        taken += 1
        last = p.wait
    return states, taken, first, last


def one_window_turns(
    bucket: Bucket, debt: float, turns: int, bound: float, first: float
) -> tuple[float, int, float]:
    """``lease_turns`` over one window (a deployment's rpm: the default config), without
    the loop: the debt after, the turns taken, the last turn's wait. A cost within the
    capacity makes each reservation add exactly its cost to the debt (its wait, over the
    interval, is at most the debt before it), so the ``k``-th turn's wait is
    ``(debt + k * cost - capacity) * interval`` and the debt after it ``debt + k * cost``:
    the turns taken are the most whose last wait stays within ``SPAN`` of the first and
    whose debt stays within ``bound``. A span at 6,000,000 a minute holds 500 turns, and
    the loop ran in Redis once per turn (docs/performance.md)."""
    rate, cost = bucket.rate, bucket.cost
    interval = rate.interval
    capacity = rate.capacity_for(cost)
    limit = first + SPAN
    most = turns  # a cost of nothing never fills the window: the checks below decide
    if cost > 0.0:
        most = min(most, math.floor((limit / interval + capacity - debt) / cost))
        if bound < math.inf:
            most = min(most, math.floor((bound - debt) / cost))
    taken = max(0, most)
    # The quotients may round across a boundary either way: the last turn is checked as
    # the loop checks a turn (it fits, or fewer do: its wait and debt only grow with it).
    while taken < turns and _fits(debt, taken + 1, cost, capacity, interval, limit, bound):
        taken += 1
    while taken > 0 and not _fits(debt, taken, cost, capacity, interval, limit, bound):
        taken -= 1
    if taken == 0:
        return debt, 0, first
    return debt + taken * cost, taken, _turn_wait(debt, taken, cost, capacity, interval)


def _fits(
    debt: float, k: int, cost: float, capacity: float, interval: float, limit: float, bound: float
) -> bool:
    """Whether the ``k``-th reservation comes within ``limit`` and keeps within ``bound``."""
    return _turn_wait(debt, k, cost, capacity, interval) <= limit and debt + k * cost <= bound


def _turn_wait(debt: float, k: int, cost: float, capacity: float, interval: float) -> float:
    """The wait of the ``k``-th of consecutive reservations from ``debt`` (one window)."""
    wait = (debt + k * cost - capacity) * interval
    return wait if wait > 0.0 else 0.0


def refused_for(first: float | None) -> float:
    """How long a replica refused a lease asks per request: until the turns ahead of it
    (``first`` seconds of them) could have drained to ``WAIT``, at least a span (another
    lease's turns: they drain at their pace); ``REFUSED_FOR`` when something else refused
    it (None: the deployment not healthy, or a key waiting for its fair share)."""
    if first is None or not math.isfinite(first):
        return REFUSED_FOR
    return min(max(first - WAIT, SPAN), REFUSED_FOR)


def grants(first: float, taken: int) -> bool:
    """Whether a lease whose first turn comes in ``first`` seconds, of ``taken`` turns,
    is granted (else nothing is charged): far from the limit, and worth a round trip."""
    return first <= WAIT and taken >= MIN_TURNS


def counted(taken: int) -> int:
    """How many of a lease's ``taken`` turns its deployment's health period counts (the
    lease's turns are numbered within them: the later ones share the last number)."""
    return min(taken, COUNTED)


def returned(stored: BucketState, end: BucketState, local: BucketState) -> BucketState | None:
    """What a bucket holds once a lease that left it at ``end`` gives back the turns its
    ``local`` bucket did not hand out: ``local``, if the bucket still holds ``end``
    (nothing touched it since); else None (nothing is written)."""
    if stored.debt == end.debt and stored.at == end.at:
        return local
    return None


class Origins:
    """Where a lease's time 0 (the storage's ``at``) falls on this process's clock, per
    storage clock: the grant's arrival, less its reply's excess delay over the quickest
    reply seen (the smallest ``received - at``, rising at most ``DRIFT`` a second), and
    never more than ``MAX_CORRECTION`` before the arrival. Never before the true moment:
    a reply is handled after the storage decided, so no offset seen is below the true one,
    and a turn is never early. A grant read late (the loop was busy when it came) then
    does not make every turn of its lease late by as much (routing/turn_clock.py does the
    same for reserved turns)."""

    def __init__(self) -> None:
        self._offsets: dict[object, tuple[float, float]] = {}

    def trusts(self, clock: object, took: float) -> bool:
        """Whether a grant on ``clock`` whose round trip ``took`` seconds can be placed:
        a grant was seen on it before (a late reply is then told by its excess), or it
        came within ``SLOW_GRANT`` (read late by that much at most). Else it is given back
        and the request asks per request (its time 0 is recorded all the same)."""
        return clock in self._offsets or took <= SLOW_GRANT

    def origin(self, clock: object, at: float, received: float) -> float:
        sample = received - at
        seen = self._offsets.get(clock)
        if seen is not None:
            value, when = seen
            sample = min(sample, value + DRIFT * max(received - when, 0.0))
        self._offsets[clock] = (sample, received)
        return max(at + sample, received - MAX_CORRECTION)


class TurnLease:
    """One turn lease as its replica uses it: the local buckets (lease time) and where
    the lease left the shared ones (``ends``, at lease time 0).

    ``serial`` tells one lease from the next; it hands out at most ``turns`` turns,
    numbered from ``sequence`` in its deployment's health period (health.counted);
    ``last`` is its last turn's wait when granted (lease time 0); ``spacing`` how long
    one of its requests holds its deployment's turns (``spacing()``); ``read`` the lease
    time its grant arrived at."""

    __slots__ = (
        "at",
        "closed",
        "ends",
        "epoch",
        "granted",
        "last",
        "origin",
        "rates",
        "read",
        "sequence",
        "serial",
        "spacing",
        "states",
        "turns",
        "uses",
    )

    def __init__(
        self,
        serial: int,
        rates: Sequence[Rate],
        debts: Sequence[float],
        ends: Sequence[float],
        at: float,
        turns: int,
        last: float,
        epoch: int = 0,
        sequence: int = 0,
        origin: float = 0.0,
        spacing: float = 0.0,
        read: float = 0.0,
    ) -> None:
        self.serial = serial
        # The caller's clock at lease time 0: when the grant arrived, so that lease times
        # read from it are never ahead of the storage's (a turn is late, never early).
        self.origin = origin
        self.rates = tuple(rates)
        self.at = at  # storage time of the grant
        self.states = [BucketState(d, 0.0) for d in debts]
        self.ends = [BucketState(d, 0.0) for d in ends]
        self.turns = turns
        self.last = last
        self.epoch = epoch
        self.sequence = sequence
        self.spacing = spacing
        self.read = read
        self.uses = 0
        self.closed = False
        self.granted = 0.0  # the last turn handed out (lease time)

    def turn(self, costs: Sequence[float], now: float, max_wait: float) -> float | None:
        """The wait for a turn of a request costing ``costs`` at lease time ``now``, now
        charged to the local buckets; None: the lease has no turn for it within
        ``max_wait`` (nothing charged)."""
        if self.closed or self.uses >= self.turns:
            return None
        buckets = [Bucket(s, r, c) for s, r, c in zip(self.states, self.rates, costs, strict=True)]
        p = plan(buckets, now)
        if p.too_large >= 0 or p.wait > max_wait:
            return None
        charged = charge(buckets, p, now)
        if not within(charged, self.ends, self.rates, now):
            return None
        self.states = charged
        self.uses += 1
        self.granted = now + p.wait
        return p.wait

    def correct(self, units: Sequence[float], now: float) -> list[float] | None:
        """A request's correction by ``units`` per window while the lease is open: what
        is added stays in the local buckets as far as the lease covers it (the rest, the
        returned excess, goes to the shared ones); what is taken off is kept (a turn
        given back could fall between turns already handed out). None when closed."""
        if self.closed:
            return None
        excess = [0.0] * len(units)
        for i, u in enumerate(units):
            if u <= 0.0:
                continue
            rate = self.rates[i]
            debt = debt_at(self.states[i], rate.interval, now)
            room = max(0.0, self.ends[i].debt - now / rate.interval - debt)
            kept = min(u, room)
            excess[i] = u - kept
            self.states[i] = BucketState(debt + kept, now)
        return excess

    def drained(self, now: float) -> bool:
        """Whether every bucket the lease charged has drained by lease time ``now``: its
        turns are all past, and the shared buckets read empty, given back or not (a
        give-back would change nothing, so none need be sent)."""
        return all(
            e.debt - now / r.interval <= 0.0 for e, r in zip(self.ends, self.rates, strict=True)
        )

    def stored(self) -> list[BucketState]:
        """The local buckets in storage time (what a give-back sets the shared ones to)."""
        return [BucketState(s.debt, self.at + s.at) for s in self.states]

    def next_turns(self, asked: int, cycle: float) -> int | None:
        """The next lease's size in turns (this one was asked for ``asked``, ``cycle``
        seconds ago), for about ``TARGET_USES`` requests at the demand it saw; None: near
        the limit (its requests took more than ``NEAR`` of the deployment's turns over the
        cycle), or not worth a lease (a whole lease as long as may be went unused though
        its grant came in time: one read after its last turn, the loop busy, says
        nothing of the demand)."""
        if self.uses * self.spacing > NEAR * cycle:
            return None
        in_time = self.read <= self.last
        if self.uses == 0 and in_time and (self.turns < asked or asked >= MAX_TURNS):
            return None
        wanted = max(asked * TARGET_USES // max(self.uses, 1), 2 * self.uses)
        return max(2 * MIN_TURNS, min(MAX_TURNS, wanted))


def spacing(rates: Sequence[Rate], costs: Sequence[float]) -> float:
    """The time a request costing ``costs`` takes of its deployment's turns: the longest
    any of its pacing windows (a minute or less) takes to refill its cost."""
    return max(
        (c * r.interval for r, c in zip(rates, costs, strict=True) if r.period <= LONG),
        default=0.0,
    )


def within(
    states: Sequence[BucketState], ends: Sequence[BucketState], rates: Sequence[Rate], now: float
) -> bool:
    """Whether local buckets charged as ``states`` (at ``now``) hold no more than the lease
    charged the shared ones (``ends``, at 0), compared at ``now``."""
    for s, e, rate in zip(states, ends, rates, strict=True):
        if s.debt > e.debt - now / rate.interval:
            return False
    return True


__all__ = [
    "COUNTED",
    "FIRST_TURNS",
    "MAX_TURNS",
    "MIN_TURNS",
    "NEAR",
    "REFUSED_FOR",
    "SLOW_GRANT",
    "SPAN",
    "TARGET_USES",
    "USE_SHARE",
    "WAIT",
    "Origins",
    "TurnLease",
    "bound",
    "counted",
    "grants",
    "lease_turns",
    "refused_for",
    "returned",
    "spacing",
    "within",
    "worth",
]
