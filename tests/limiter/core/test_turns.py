"""Turn leases (turns.py): a paced deployment's turns handed out by the replicas that
leased them are, all replicas together, a history its buckets would have admitted: never
two turns of a paced window closer than its interval. Pure: an injected clock, random
histories of several replicas leasing, asking per request and giving back."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.limiter.base import Rate
from proxy.limiter.core import turns
from proxy.limiter.core.bucket import Bucket, BucketState, adjust, charge, debt_at, plan, take_all
from proxy.limiter.core.turns import TurnLease, bound, grants, lease_turns, returned

EPS = 1e-9  # units: float rounding, nothing more

RPM = Rate(600_000.0, 60.0, 1.0)  # burst 1: a turn every 100 us
TPM = Rate(60_000_000.0, 60.0, 1.0, ceiling=60_000_000.0)  # tokens, paced
RPD = Rate(2_000_000.0, 86400.0, 2_000_000.0)  # a day's total


class World:
    """One deployment's shared buckets, replicas leasing turns of it, every turn sent."""

    def __init__(self, rates: list[Rate], replicas: int) -> None:
        self.rates = rates
        self.states = [BucketState() for _ in rates]
        self.leases: list[TurnLease | None] = [None] * replicas
        self.sent: list[tuple[float, list[float]]] = []  # (turn, cost per window)
        self.serial = 0

    def buckets(self, costs: list[float]) -> list[Bucket]:
        return [Bucket(s, r, c) for s, r, c in zip(self.states, self.rates, costs, strict=True)]

    def give_back(self, who: int, now: float | None = None) -> None:
        """``now``: the give-back is skipped once the lease has drained (as leases.py)."""
        t = self.leases[who]
        self.leases[who] = None
        if t is None or t.closed:
            return
        t.closed = True
        if now is not None and t.drained(now - t.at):
            return
        for i, (end, local) in enumerate(zip(t.ends, t.stored(), strict=True)):
            got = returned(self.states[i], BucketState(end.debt, t.at), local)
            if got is not None:
                self.states[i] = got

    def lease(self, who: int, costs: list[float], size: int, now: float) -> TurnLease | None:
        self.give_back(who)
        bounds = [
            bound(r, debt_at(s, r.interval, now))
            for s, r in zip(self.states, self.rates, strict=True)
        ]
        after, taken, first, last = lease_turns(self.buckets(costs), size, bounds, now)
        if not grants(first, taken):
            return None
        before = [debt_at(s, r.interval, now) for s, r in zip(self.states, self.rates, strict=True)]
        self.states = after
        self.serial += 1
        t = TurnLease(self.serial, self.rates, before, [s.debt for s in after], now, taken, last)
        self.leases[who] = t
        return t

    def request(self, who: int, costs: list[float], size: int, now: float) -> None:
        """A request of replica ``who``: from its lease, else a new lease, else per request."""
        for _ in range(2):
            t = self.leases[who]
            if t is not None:
                wait = t.turn(costs, now - t.at, math.inf)
                if wait is not None:
                    self.sent.append((t.at + t.granted, costs))  # its granted time
                    return
            if self.lease(who, costs, size, now) is None:
                break
        self.per_request(costs, now)

    def per_request(self, costs: list[float], now: float) -> None:
        self.states, decision = take_all(self.buckets(costs), now, math.inf)
        if decision.allowed:
            self.sent.append((now + decision.wait, costs))

    def conforms(self) -> bool:
        """The turns sent, in time order, fit every bucket (GCRA on the real sends)."""
        for i, rate in enumerate(self.rates):
            state = BucketState()
            for at, costs in sorted(self.sent, key=lambda s: s[0]):
                cost = costs[i]
                if debt_at(state, rate.interval, at) + cost > rate.capacity_for(cost) + EPS:
                    return False
                state = adjust(state, rate, cost, at)
        return True


windows = st.sampled_from([[RPM], [RPM, TPM], [RPM, RPD], [RPM, TPM, RPD]])
events = st.lists(
    st.tuples(
        # seconds since the last event: at once, within a few turns, within a lease
        st.one_of(st.just(0.0), st.floats(0.0, 0.0003), st.floats(0.0, 0.006)),
        st.integers(0, 2),  # which replica
        st.sampled_from(["lease", "lease", "lease", "per_request", "give_back"]),
        st.sampled_from([1.0, 1.0, 40.0, 2000.0]),  # the request's tokens
        st.sampled_from([2, 8, 64, 512]),  # the lease's size asked for
    ),
    max_size=200,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(rates=windows, replicas=st.integers(1, 3), history=events)
def test_turns_sent_never_come_closer_than_the_buckets_allow(
    rates: list[Rate], replicas: int, history: list[tuple[float, int, str, float, int]]
) -> None:
    world = World(rates, replicas)
    now = 0.0
    for dt, who, action, tokens, size in history:
        now += dt
        who %= replicas
        costs = [tokens if r is TPM else 1.0 for r in rates]
        if action == "lease":
            world.request(who, costs, size, now)
        elif action == "per_request":
            world.per_request(costs, now)
        else:
            world.give_back(who, now if tokens == 1.0 else None)
    assert world.conforms()
    paced = sorted(at for at, _ in world.sent)
    # The request window paces: a turn every interval at the closest.
    assert all(b - a >= RPM.interval * (1 - 1e-9) for a, b in itertools.pairwise(paced))


def test_a_lease_takes_the_turns_of_consecutive_reservations() -> None:
    state = BucketState(3.0, 0.0)
    after, taken, first, last = lease_turns([Bucket(state, RPM, 1.0)], 10, [math.inf], 0.0)
    assert (taken, first) == (10, 3.0 * RPM.interval)
    assert math.isclose(last, 12.0 * RPM.interval)
    assert after[0].debt == 13.0
    # ... as ten reservations one after the other would be charged.
    s = state
    for _ in range(10):
        b = [Bucket(s, RPM, 1.0)]
        s = charge(b, plan(b, 0.0), 0.0)[0]
    assert s.debt == after[0].debt


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    debt=st.floats(0.0, 800.0),
    cost=st.sampled_from([1.0, 0.5, 3.0, 1234.0]),
    per_minute=st.sampled_from([600_000.0, 6_000_000.0, 60_000.0, 3.0e9]),
    size=st.integers(1, 512),
    capped=st.booleans(),
)
def test_one_window_is_counted_as_the_loop_counts_it(
    debt: float, cost: float, per_minute: float, size: int, capped: bool
) -> None:
    """One window's turns without the loop (one_window_turns) are the loop's, to the
    rounding: the loop adds the cost turn by turn (and its debt creeps up by an ulp now
    and then, a wait divided back by the interval), where this adds them at once, so at
    the span's or the bound's edge the two may differ by a turn. Otherwise the same
    turns, the same last wait and debt after; and the last turn taken always fits.
    (Two windows alike run the loop, each as one would.)"""
    rate = Rate(per_minute, 60.0, max(cost, 1.0))
    state = BucketState(debt, 0.0)
    limit = debt + 37.5 * cost if capped else math.inf
    (after,), taken, first, last = lease_turns([Bucket(state, rate, cost)], size, [limit], 0.0)
    looped = lease_turns([Bucket(state, rate, cost)] * 2, size, [limit] * 2, 0.0)
    assert first == looped[2]
    assert abs(taken - looped[1]) <= 1
    assert after.debt == (debt + taken * cost if taken else debt)
    assert last <= first + turns.SPAN and after.debt <= limit
    if taken == looped[1]:
        assert math.isclose(last, looped[3], rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(after.debt, looped[0][0].debt, rel_tol=1e-12)


def test_a_lease_reaches_at_most_a_span_past_its_first_turn() -> None:
    _, taken, first, last = lease_turns([Bucket(BucketState(), RPM, 1.0)], 10_000, [math.inf], 0.0)
    assert first == 0.0
    assert last <= turns.SPAN < last + RPM.interval
    assert math.isclose(last, (taken - 1) * RPM.interval)


def test_a_long_window_loses_at_most_a_share_of_its_capacity() -> None:
    day = Rate(3200.0, 86400.0, 3200.0)
    debt = 0.0
    _, taken, _, _ = lease_turns(
        [
            Bucket(BucketState(), Rate(6e6, 60.0, 1.0), 1.0),
            Bucket(BucketState(debt, 0.0), day, 1.0),
        ],
        512,
        [math.inf, bound(day, debt)],
        0.0,
    )
    assert taken == 100  # 1/32 of 3200
    assert bound(RPM, 5.0) == math.inf


def test_a_lease_is_granted_only_far_from_the_limit() -> None:
    assert grants(0.0, turns.MIN_TURNS)
    assert grants(turns.WAIT, 8)
    assert not grants(turns.WAIT * 1.01, 8)  # a queue of turns ahead: near the limit
    assert not grants(0.0, turns.MIN_TURNS - 1)


def test_a_local_turn_is_the_one_the_shared_bucket_would_give() -> None:
    t = TurnLease(1, [RPM], [0.0], [8.0], at=100.0, turns=8, last=7 * RPM.interval)
    assert t.turn([1.0], 0.0, math.inf) == 0.0  # the first: now
    assert t.turn([1.0], 0.0, math.inf) == RPM.interval  # the next: one interval later
    # Far apart, each goes at once (the local bucket drains, as the shared one would).
    assert t.turn([1.0], 5 * RPM.interval, math.inf) == 0.0
    # Beyond the lease's last turn: none.
    assert t.turn([1.0], 7.5 * RPM.interval, math.inf) is None
    assert t.uses == 3


def test_a_turn_beyond_max_wait_is_not_handed_out() -> None:
    t = TurnLease(1, [RPM], [2.0], [10.0], at=0.0, turns=8, last=9 * RPM.interval)
    assert t.turn([1.0], 0.0, RPM.interval) is None  # its turn is two intervals ahead
    assert t.uses == 0
    assert t.turn([1.0], 0.0, 1.0) == 2 * RPM.interval


def test_a_give_back_leaves_only_the_turns_handed_out() -> None:
    t = TurnLease(1, [RPM], [0.0], [8.0], at=100.0, turns=8, last=7 * RPM.interval)
    t.turn([1.0], 0.0, math.inf)
    t.turn([1.0], 0.0, math.inf)
    end = BucketState(8.0, 100.0)
    local = t.stored()[0]
    assert returned(end, end, local) == BucketState(2.0, 100.0)
    # Another turn was charged since: nothing goes back (it would fall between turns).
    assert returned(BucketState(9.0, 100.0001), end, local) is None


@pytest.mark.slow
@given(
    rates=windows,
    used=st.integers(0, 8),
    tokens=st.sampled_from([1.0, 40.0, 2000.0]),
    later=st.floats(0.0, 120.0),
)
def test_a_drained_lease_given_back_or_not_leaves_the_same_buckets(
    rates: list[Rate], used: int, tokens: float, later: float
) -> None:
    """Once every bucket a lease charged has drained, its give-back changes nothing
    anyone reads: the shared buckets hold the same debt from then on either way."""
    world = World(rates, 1)
    costs = [tokens if r is TPM else 1.0 for r in rates]
    t = world.lease(0, costs, 8, 0.0)
    if t is None:
        return
    for _ in range(used):
        t.turn(costs, 0.0, math.inf)
    drained_at = max(e.debt * r.interval for e, r in zip(t.ends, t.rates, strict=True))
    now = drained_at * (1 + 1e-9) + later  # past it by float rounding at least
    assert t.drained(now)
    kept = list(world.states)
    world.give_back(0)  # written, as if not drained
    for i, r in enumerate(rates):
        for at in (now, now + later, now + 86400.0):
            assert debt_at(world.states[i], r.interval, at) == pytest.approx(
                debt_at(kept[i], r.interval, at), abs=EPS
            )


def test_a_lease_is_drained_only_once_every_window_it_charged_is() -> None:
    t = TurnLease(1, [RPM, RPD], [0.0, 0.0], [8.0, 8.0], at=0.0, turns=8, last=0.0007)
    assert not t.drained(8 * RPM.interval)  # the day's window holds its 8 turns
    short = TurnLease(2, [RPM], [0.0], [8.0], at=0.0, turns=8, last=0.0007)
    assert not short.drained(7.9 * RPM.interval)
    assert short.drained(8 * RPM.interval)


def test_corrections_stay_in_the_lease_as_far_as_it_covers_them() -> None:
    t = TurnLease(1, [RPM], [0.0], [4.0], at=0.0, turns=4, last=3 * RPM.interval)
    t.turn([1.0], 0.0, math.inf)
    assert t.correct([2.0], 0.0) == [0.0]
    assert t.correct([3.0], 0.0) == [2.0]  # one more fits, two go to the shared bucket
    assert t.correct([-1.0], 0.0) == [0.0]  # kept: a turn given back is not handed out again
    assert t.states[0].debt == 4.0
    t.closed = True
    assert t.correct([1.0], 0.0) is None


def test_a_lease_is_sized_by_the_demand_it_saw() -> None:
    spacing = RPM.interval
    t = TurnLease(1, [RPM], [0.0], [64.0], at=0.0, turns=64, last=63 * spacing, spacing=spacing)
    cycle = 200 * spacing  # from asking for this lease to asking for the next
    t.uses = 2
    assert t.next_turns(64, cycle) == 64 * turns.TARGET_USES // 2
    t.uses = 0
    assert t.next_turns(64, cycle) == 64 * turns.TARGET_USES
    assert t.next_turns(turns.MAX_TURNS, cycle) is None  # a whole lease unused: per request
    t.uses = 1  # one request in a lease as long as may be: still leased (no worse)
    assert t.next_turns(turns.MAX_TURNS, cycle) == turns.MAX_TURNS


def test_a_replica_taking_a_quarter_of_the_turns_over_a_cycle_is_near_the_limit() -> None:
    spacing = RPM.interval
    t = TurnLease(1, [RPM], [0.0], [64.0], at=0.0, turns=64, last=63 * spacing, spacing=spacing)
    t.uses = 17  # more than a quarter of the lease's turns...
    assert t.next_turns(64, 64 * spacing) is None  # ... in its own span: near
    # ... but over a cycle four times as long (a burst of requests that waited for the
    # renewal, then a lull): far from the limit, and the next lease sized for the demand
    # (64 * 8 // 17 = 30 turns), but for twice the burst at least.
    assert t.next_turns(64, 4 * 64 * spacing) == 2 * 17
    t.uses = 3
    assert t.next_turns(64, 4 * 64 * spacing) == 64 * turns.TARGET_USES // 3


def test_a_replica_refused_for_the_turns_ahead_asks_again_once_they_could_drain() -> None:
    assert turns.refused_for(turns.WAIT + 0.1) == pytest.approx(0.1)
    assert turns.refused_for(turns.WAIT + 0.0001) == turns.SPAN  # at least a span
    assert turns.refused_for(10.0) == turns.REFUSED_FOR  # at most as before
    assert turns.refused_for(None) == turns.REFUSED_FOR  # not healthy, or a key waiting
    assert turns.refused_for(math.nan) == turns.REFUSED_FOR


def test_a_lease_read_after_its_last_turn_is_not_taken_for_no_demand() -> None:
    """Its turns passed while the loop was busy: nothing said no request wanted them."""
    spacing = RPM.interval
    late = TurnLease(
        1, [RPM], [0.0], [32.0], at=0.0, turns=32, last=31 * spacing, spacing=spacing,
        read=40 * spacing,
    )  # fmt: skip
    assert late.next_turns(64, 80 * spacing) == 64 * turns.TARGET_USES
    in_time = TurnLease(
        1, [RPM], [0.0], [32.0], at=0.0, turns=32, last=31 * spacing, spacing=spacing
    )
    assert in_time.next_turns(64, 80 * spacing) is None


def test_a_request_holds_its_paced_windows_turns_for_its_cost() -> None:
    assert turns.spacing([RPM], [1.0]) == RPM.interval
    assert turns.spacing([RPM, TPM], [1.0, 500.0]) == max(RPM.interval, 500 * TPM.interval)
    assert turns.spacing([RPD], [1.0]) == 0.0  # a day's window does not pace


def test_a_slow_deployment_is_not_worth_a_lease() -> None:
    """Its turns are too far apart for two in a span: it asks per request, as before."""
    slow = Rate(600.0, 60.0, 1.0)  # a turn every 100 ms
    assert not turns.worth([slow], [1.0], [1.0])
    assert turns.worth([RPM], [1.0], [1.0])
    assert turns.worth([RPM, RPD], [1.0, RPD.capacity], [1.0, 1.0])  # a day's total: no pace
    assert not turns.worth([RPM, TPM], [1.0, 400_000.0], [1.0, 400_000.0])  # large requests


def test_a_grant_read_late_does_not_make_its_turns_late() -> None:
    """A lease's time 0 falls where the quickest grant says the storage's clock stands:
    a reply handled 40 ms late (a busy loop) moves it back by those 40 ms, never before
    the true moment, and never more than MAX_CORRECTION (a storage clock stepping back)."""
    origins = turns.Origins()
    # This clock reads the storage's plus 1000 s; replies take 0.2 ms.
    assert origins.origin("g", 10.0, 1010.0002) == 1010.0002
    late = origins.origin("g", 11.0, 1011.0402)  # handled 40 ms late
    assert 1011.0 <= late <= 1011.0002 + turns.DRIFT * 1.04
    # A storage clock stepped back by a second: at most MAX_CORRECTION is believed.
    stepped = origins.origin("g", 11.0, 1012.0002)
    assert stepped == 1012.0002 - turns.MAX_CORRECTION
    assert origins.origin("other", 5.0, 1010.0) == 1010.0  # each storage clock its own


def test_a_first_grant_that_came_slowly_is_not_trusted() -> None:
    """With no grant seen before on its clock, a slow one may have been read late: every
    turn of its lease would be late by as much. It is given back (leases.py); the next
    grant has its measure to go by."""
    origins = turns.Origins()
    assert origins.trusts("g", turns.SLOW_GRANT)
    assert not origins.trusts("g", 0.040)
    origins.origin("g", 10.0, 1010.040)
    assert origins.trusts("g", 0.040)


def test_a_lease_counts_the_turns_it_is_expected_to_hand_out() -> None:
    """Not every turn it holds: a 429 after leases would teach a rate far above the one
    really sent (health.py divides the turns counted by the time they took)."""
    assert turns.counted(3) == 3
    assert turns.counted(470) == turns.COUNTED == 2 * turns.TARGET_USES
