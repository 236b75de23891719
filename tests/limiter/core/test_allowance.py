"""Leases of budget (allowance.py): a replica's requests admitted from a lease never make
more than the shared bucket allows, and what a lease gives back leaves the bucket exact.
Pure: an injected clock, random histories of several replicas."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.limiter.base import Rate
from proxy.limiter.core import allowance
from proxy.limiter.core.allowance import (
    Allowance,
    lease_floor,
    lease_hold,
    lease_refund,
    lease_size,
)
from proxy.limiter.core.bucket import Bucket as B
from proxy.limiter.core.bucket import BucketState, Plan, adjust, charge, debt_at, plan, take

EPS = 1e-9
# A request's estimate (an ask's) by what it really uses: small ones thrice (a lease
# may cover them), larger ones far more (they may cover a lease's hold).
ESTIMATES = {1.0: 3.0, 3.0: 105.0, 17.0: 595.0}


class Replica:
    def __init__(self) -> None:
        self.lease: Allowance | None = None
        self.size = allowance.FIRST_REQUESTS
        # Its unsettled asks: the lease each was admitted from (None: the shared bucket)
        # and what it over-estimated.
        self.asked: list[tuple[Allowance | None, float]] = []


class World:
    """A shared bucket, replicas leasing from it, and every admission as it happened."""

    def __init__(self, rate: Rate, replicas: int) -> None:
        self.rate = rate
        self.state = BucketState()
        self.replicas = [Replica() for _ in range(replicas)]
        # (time, cost), in time order; a settlement's refund is a negative cost.
        self.admitted: list[tuple[float, float]] = []
        self.serial = 0
        self.mark: tuple[float, float] | None = None  # the last lease's (at, debt left)
        self.floor = BucketState()  # what the leases count on (allowance.lease_floor)

    def give_back(self, r: Replica, now: float) -> None:
        a = r.lease
        if a is None or a.closed:
            return
        a.closed = True
        last = self.mark == (a.at, a.marks[0])
        refund = lease_refund(a.amounts[0], a.used[0], a.hold, now - a.at, last)
        if refund > 0.0:
            self.floor = adjust(self.floor, self.rate, -refund, now)
            self.state = adjust(self.state, self.rate, -refund, now, self.floor)

    def ask(self, r: Replica, cost: float, estimate: float, now: float) -> bool:
        """A request estimated at ``estimate`` units, ``cost`` of which it really uses
        (settled later: ``settle``), admitted from the replica's lease if it covers it,
        else asking the shared bucket (no new lease: as near a limit)."""
        a = r.lease
        if a is not None and a.covers([estimate], now):
            a.take([estimate], now)
        else:
            a = None
            self.state, decision = take(self.state, self.rate, estimate, now, 0.0)
            if not decision.allowed:
                return False
        self.admitted.append((now, estimate))
        r.asked.append((a, estimate - cost))
        return True

    def settle(self, r: Replica, now: float) -> None:
        """Its oldest unsettled ask gives back what it did not use: to its lease while
        open (Allowance.correct), else to the shared bucket (settle_key's adjust)."""
        if r.asked:
            a, refund = r.asked.pop(0)
            if a is None or a.correct([-refund], now) is None:
                self.state = adjust(self.state, self.rate, -refund, now, self.floor)
            self.admitted.append((now, -refund))

    def request(self, r: Replica, cost: float, now: float) -> bool:
        a = r.lease
        if a is not None and a.covers([cost], now):
            a.take([cost], now)
            self.admitted.append((now, cost))
            return True
        if a is not None:
            r.size = a.next_size(r.size, now)
        self.give_back(r, now)
        r.lease = None
        size = lease_size(r.size, [cost], [self.rate], [cost])
        if size is not None:
            turns, amounts = size
            debt = debt_at(self.state, self.rate.interval, now)
            hold = lease_hold([debt], amounts, [self.rate])
            if hold > 0.0:
                buckets = [B(self.state, self.rate, amounts[0])]
                # Charged as arriving at the end of its hold (lease.lua's take_lease).
                p = plan(buckets, now)
                self.floor = lease_floor(self.floor, self.rate, hold, amounts[0], now)
                (self.state,) = charge(buckets, Plan(p.debts, hold, -1, -1), now)
                self.mark = (now, self.state.debt)
                self.serial += 1
                r.lease = Allowance(
                    self.serial, [self.rate], amounts, [debt], now, hold, now, now, turns
                )
                r.lease.take([cost], now)
                self.admitted.append((now, cost))
                return True
        self.state, decision = take(self.state, self.rate, cost, now, 0.0)
        if decision.allowed:
            self.admitted.append((now, cost))
        return decision.allowed

    def real_debt(self, now: float) -> float:
        """The debt the admissions really made, replayed through an exact bucket: an ask
        counts its estimate until its settlement takes back what it did not use, as it
        would were nothing ever leased."""
        state = BucketState()
        for at, cost in self.admitted:
            if at <= now:
                state = adjust(state, self.rate, cost, at)
        return debt_at(state, self.rate.interval, now)

    def usable(self, now: float) -> float:
        """The units the replicas' open leases may still admit without asking."""
        return sum(
            a.amounts[0] - a.used[0]
            for a in (r.lease for r in self.replicas)
            if a is not None and not a.closed and now < a.until
        )

    def conforms(self) -> bool:
        """Every admission, replayed in order, fits the bucket's capacity."""
        state = BucketState()
        for at, cost in self.admitted:
            too_much = debt_at(state, self.rate.interval, at) + cost > self.rate.capacity + EPS
            if cost > 0.0 and too_much:  # a refund is no admission
                return False
            state = adjust(state, self.rate, cost, at)
        return True


events = st.lists(
    st.tuples(
        st.floats(0.0, 0.3),  # seconds since the last event
        st.integers(0, 2),  # which replica
        st.sampled_from(["request", "request", "request", "give_back", "ask", "settle"]),
        st.sampled_from([1.0, 1.0, 3.0, 17.0]),  # the request's cost
    ),
    max_size=300,
)


# The named tests' world: two replicas, 1,000 units a second (1 ms a unit).
TWO_AT_1000 = {"limit": 60000.0, "capacity_share": 0.5, "replicas": 2}


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
# A lease whose hold the debt of an earlier one covered (see the test below).
@example(
    **TWO_AT_1000,
    history=[
        (0.0, 0, "request", 1.0),
        (0.0, 0, "request", 17.0),
        (0.25, 1, "request", 1.0),
        (0.1875, 0, "give_back", 1.0),
        (0.125, 1, "request", 1.0),
    ],
)
# A per-request ask's refund under a later lease (see the test below).
@example(
    **TWO_AT_1000,
    history=[
        (0.0, 0, "ask", 17.0),
        (0.0, 1, "request", 1.0),
        (0.1, 0, "settle", 1.0),
    ],
)
@given(
    limit=st.sampled_from([600.0, 6000.0, 60000.0]),
    capacity_share=st.sampled_from([0.05, 0.5, 1.0]),
    replicas=st.integers(1, 3),
    history=events,
)
def test_admissions_never_exceed_the_bucket(
    limit: float, capacity_share: float, replicas: int, history: list[tuple[float, int, str, float]]
) -> None:
    world = World(Rate(limit, 60.0, limit * capacity_share), replicas)
    now = 0.0
    for dt, who, action, cost in history:
        now += dt
        r = world.replicas[who % replicas]
        if action == "request":
            world.request(r, cost, now)
        elif action == "ask":  # asked per request, estimated well above its use
            world.ask(r, cost, ESTIMATES[cost], now)
        elif action == "settle":
            world.settle(r, now)
        else:
            world.give_back(r, now)
            r.lease = None
        # The shared bucket never holds less than what was really used, and what the
        # open leases may still use without asking.
        shared = debt_at(world.state, world.rate.interval, now)
        assert shared >= world.real_debt(now) + world.usable(now) - 1e-6
    assert world.conforms()


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(history=st.lists(st.tuples(st.floats(0.0, 0.05), st.sampled_from([1.0, 5.0])), max_size=200))
def test_one_replica_gives_back_all_but_its_holds_refill(
    history: list[tuple[float, float]],
) -> None:
    """Alone, a replica that gives its lease back leaves the bucket as if every request
    had asked it one by one, but for what its hold reserved: the hold's refill, and its
    units charged as of the hold's end."""
    world = World(Rate(6000.0, 60.0, 6000.0), 1)
    r = world.replicas[0]
    now = 0.0
    for dt, cost in history:
        now += dt
        world.request(r, cost, now)
    world.give_back(r, now)
    shared = debt_at(world.state, world.rate.interval, now)
    real = world.real_debt(now)
    # The hold's refill, and the lease's used units counted as of its end, not as used.
    assert real - 1e-6 <= shared <= real + 2 * allowance.HOLD / world.rate.interval + 1e-6


def test_a_lease_taken_after_another_keeps_the_units_its_hold_counted_on() -> None:
    """1,000 a second (1 ms a unit): replica 0 leases 272 units at 0 s (hold 0.5 s), so
    the debt reads 773. Replica 1 leases 8 at 0.25 s: the debt, 523, already covers its
    hold (500 units to 0.75 s), so it adds only its 8 (531) and counts on the rest to
    keep its units counted until 0.75 s. Were replica 0's 255 unused units given back at
    0.4375 s, the debt would drain to zero at 0.526 s and replica 1's next request, at
    0.5625 s, would be used while the shared bucket counts nothing: the rest of the
    fleet could then take a whole capacity beside it. Replica 0's lease is not the last:
    it gives nothing back."""
    world = World(Rate(60000.0, 60.0, 30000.0), 2)
    first, second = world.replicas
    world.request(first, 1.0, 0.0)
    world.request(first, 17.0, 0.0)  # a bigger lease; the first, the last then, gave back 7
    assert debt_at(world.state, 0.001, 0.0) == 773.0
    world.request(second, 1.0, 0.25)
    assert debt_at(world.state, 0.001, 0.25) == 531.0
    world.give_back(first, 0.4375)
    assert math.isclose(debt_at(world.state, 0.001, 0.4375), 343.5)  # nothing came back
    assert world.request(second, 1.0, 0.5625)
    assert debt_at(world.state, 0.001, 0.5625) >= world.real_debt(0.5625) == 1.0
    # Its own lease, the last, still gives back what it did not use.
    world.give_back(second, 0.6)
    assert math.isclose(debt_at(world.state, 0.001, 0.6), 531.0 - 350.0 - 6.0)


def test_a_refund_never_takes_the_units_a_later_lease_counted_on() -> None:
    """1,000 a second (1 ms a unit): a request asks for 600 units at 0 s; replica 1
    leases 8 (hold 0.5 s): the debt, 600, already covers its hold, so it adds only its 8
    (608). At 0.1 s the request settles, having used 10: a refund of 590 would leave
    nothing (508 - 590), while the lease may still admit 7 units until 0.375 s. The
    refund stops at what the lease counts on: its hold's refill and its units, 508 at
    0 s, 408 at 0.1 s."""
    world = World(Rate(60000.0, 60.0, 30000.0), 2)
    asker, leaser = world.replicas
    assert world.ask(asker, 10.0, 600.0, 0.0)
    assert world.request(leaser, 1.0, 0.0)
    assert debt_at(world.state, 0.001, 0.0) == 608.0
    world.settle(asker, 0.1)
    assert math.isclose(debt_at(world.state, 0.001, 0.1), 408.0)
    assert debt_at(world.state, 0.001, 0.1) >= world.real_debt(0.1) + world.usable(0.1) == 7.0


def test_a_refund_with_no_lease_counting_on_it_comes_back_whole() -> None:
    """Once a lease's hold and its units have drained (0.5 s + 8 ms here), nothing holds
    a refund back: one replica stays as exact as without leases."""
    world = World(Rate(60000.0, 60.0, 30000.0), 2)
    asker, leaser = world.replicas
    assert world.request(leaser, 1.0, 0.0)
    world.give_back(leaser, 0.2)
    assert world.ask(asker, 10.0, 600.0, 0.6)
    world.settle(asker, 0.7)
    assert math.isclose(debt_at(world.state, 0.001, 0.7), 0.0)
    # No lease ever: a refund is bucket.adjust's, whole.
    alone = World(Rate(60000.0, 60.0, 30000.0), 1)
    assert alone.ask(alone.replicas[0], 10.0, 600.0, 0.0)
    alone.settle(alone.replicas[0], 0.1)
    assert alone.state == adjust(BucketState(600.0, 0.0), alone.rate, -590.0, 0.1)


def test_a_lease_is_taken_only_far_from_the_limit() -> None:
    rate = Rate(6000.0, 60.0, 6000.0)  # 100 a second, all at once
    assert lease_hold([0.0], [100.0], [rate]) == allowance.HOLD
    # At most 3/4 full with the lease: 4,400 + 100 fits, 4,401 + 100 does not.
    assert lease_hold([4400.0], [100.0], [rate]) > 0.0
    assert lease_hold([4401.0], [100.0], [rate]) == 0.0


def test_a_lease_holds_only_as_long_as_the_bucket_has_room() -> None:
    # 1,000 a second but only 100 at once: a hold reserves half of it in refill, 50
    # units, 50 ms.
    rate = Rate(60000.0, 60.0, 100.0)
    assert math.isclose(lease_hold([0.0], [10.0], [rate]), 0.05)
    # ...so that another replica's lease fits beside it (it reuses that refill).
    assert lease_hold([50.0 + 10.0], [10.0], [rate]) > 0.0
    # A burst of one (a paced deployment) never holds a lease.
    assert lease_size(8, [1.0], [Rate(60.0, 60.0, 1.0)], [1.0]) is None


def test_small_windows_are_never_leased_from() -> None:
    # One lease takes at most 1/32 of a window: 64 requests hold two at most.
    assert lease_size(8, [1.0], [Rate(64.0, 60.0, 64.0)], [1.0]) == (2, [2.0])
    assert lease_size(8, [1.0], [Rate(63.0, 60.0, 63.0)], [1.0]) is None
    # Tokens: the request's own estimate and as many more as fit in the share.
    # Tokens: the request's own estimate and as many more as fit in the share
    # (100,000 / 32 = 3,125 tokens: six requests of 500).
    rates = [Rate(1e6, 60.0, 1e6), Rate(1e5, 60.0, 1e5)]
    assert lease_size(8, [1.0, 500.0], rates, [1.0, 500.0]) == (6, [6.0, 3000.0])


def test_nothing_is_given_back_after_the_hold() -> None:
    assert lease_refund(10.0, 3.0, 0.5, 0.6, last=True) == 0.0
    # Within it: the units its requests did not use (never its hold's refill)...
    assert lease_refund(10.0, 3.0, 0.5, 0.1, last=True) == 7.0
    # ...unless another lease was taken since (it may count on them).
    assert lease_refund(10.0, 3.0, 0.5, 0.1, last=False) == 0.0


def test_corrections_stay_in_an_open_lease() -> None:
    rate = Rate(6000.0, 60.0, 6000.0)
    a = Allowance(1, [rate], [10.0], [0.0], 0.0, 0.5, 0.0, 0.0, turns=8)
    a.take([4.0], 0.0)
    assert a.correct([-3.0], 0.0) == [0.0]  # a refund frees room in the lease
    assert a.used == [1.0]
    assert a.correct([12.0], 0.0) == [3.0]  # what it cannot hold goes to the bucket
    a.closed = True
    assert a.correct([1.0], 0.0) is None


def test_a_lease_grows_while_used_up_and_shrinks_when_idle() -> None:
    a = Allowance(1, [], [], [], 0.0, 0.5, 0.0, 0.0, turns=8)
    assert a.next_size(8, 0.1) == 16  # used up before its time
    assert a.next_size(8, 1.0) == 4  # idle: fewer than a quarter used
    a.uses = 2
    assert a.next_size(8, 1.0) == 8
