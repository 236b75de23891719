"""Fair share between client keys: the pure rule (fairness.py) as a table and as
properties, and the schedule it makes, simulated on the memory backend with an injected
clock (closed loops of requests that ask again exactly when told: no sleeps)."""

from __future__ import annotations

import heapq
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.limits import Clock, rpm

from proxy.costs import estimate_cost
from proxy.limiter.base import Claimant, DeploymentLimits, GroupAsk
from proxy.limiter.core.fairness import MIN_RETRY, Waiter, defer, depth
from proxy.limiter.memory import MemoryLimiter

NOW = 100.0
A = Claimant("a")


@pytest.mark.parametrize(
    ("claimant", "wait", "held", "waiting", "want"),
    [
        # A turn that can go now is never deferred.
        (A, 0.0, [100.1] * 9, {"b": Waiter(5, 1.0, 200.0)}, None),
        # Within the lookahead and nobody else waiting: committed.
        (A, 0.5, [100.1, 100.2], {}, None),
        # Past the lookahead: ask again once the schedule has drained to it.
        (A, 0.8, [], {}, ("lookahead", 0.3)),
        # A higher tier waits: nothing ahead for a lower tier.
        (A, 0.2, [], {"b": Waiter(1, 1.0, 200.0)}, ("tier", MIN_RETRY)),
        # A lower tier waiting changes nothing.
        (Claimant("a", 1), 0.2, [], {"b": Waiter(0, 1.0, 200.0)}, None),
        # Another key of the tier waits: a holds its share (5 turns / 2, rounded down).
        (A, 0.3, [100.1, 100.2], {"b": Waiter(0, 1.0, 200.0)}, ("share", 0.1)),
        (A, 0.3, [100.1], {"b": Waiter(0, 1.0, 200.0)}, None),
        # Weighted: a (weight 3) may hold 3 / 4 of the 5 turns, rounded down.
        (Claimant("a", 0, 3.0), 0.3, [100.1] * 2, {"b": Waiter(0, 1.0, 200.0)}, None),
        (Claimant("a", 0, 3.0), 0.3, [100.1] * 3, {"b": Waiter(0, 1.0, 200.0)}, ("share", 0.1)),
        # Always at least one turn, whatever the weights.
        (Claimant("a", 0, 0.01), 0.3, [], {"b": Waiter(0, 100.0, 200.0)}, None),
        # The claimant's own registration is not someone else waiting.
        (A, 0.3, [100.1] * 4, {"a": Waiter(0, 1.0, 200.0)}, None),
    ],
)
def test_defer(
    claimant: Claimant,
    wait: float,
    held: list[float],
    waiting: dict[str, Waiter],
    want: tuple[str, float] | None,
) -> None:
    turns = depth([0.1], 0.5)
    got = defer(claimant, wait, held, waiting, turns, 0.5, NOW)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.reason, got.retry_after) == (want[0], pytest.approx(want[1]))


def test_depth_counts_the_turns_of_every_deployment() -> None:
    assert depth([0.1, 0.25], 0.5) == pytest.approx(7.0)
    assert depth([0.0], 0.5) == float("inf")


@pytest.mark.slow
@given(
    wait=st.floats(0.0, 5.0),
    lookahead=st.sampled_from([0.25, 0.5, 2.0]),
    held=st.lists(st.floats(100.001, 110.0), max_size=8).map(sorted),
    others=st.dictionaries(
        st.sampled_from(["b", "c", "d"]),
        st.builds(Waiter, st.integers(0, 2), st.sampled_from([0.5, 1.0, 3.0]), st.just(200.0)),
    ),
    tier=st.integers(0, 2),
)
def test_a_deferral_is_never_a_busy_loop_and_a_key_holding_nothing_gets_in(
    wait: float,
    lookahead: float,
    held: list[float],
    others: dict[str, Waiter],
    tier: int,
) -> None:
    claimant = Claimant("a", tier)
    got = defer(claimant, wait, held, others, depth([0.1], lookahead), lookahead, NOW)
    if got is not None:
        assert got.retry_after >= MIN_RETRY
    higher = any(w.tier > tier for w in others.values())
    if not held and not higher and wait <= lookahead:
        assert got is None


# -- the schedule, simulated -------------------------------------------------------------

TEN_A_SECOND = DeploymentLimits("d", windows=(rpm(600, 1),))


def simulate(
    demand: dict[Claimant, tuple[int, float]], seconds: float, lookahead: float = 0.5
) -> tuple[dict[str, int], dict[str, list[float]]]:
    """Each claimant runs ``connections`` closed loops (a request is answered at its
    turn, then the next one is sent), or with a period, one request every ``period``
    seconds. Returns the turns each got in the last 3/4 of the time and every wait
    (from sending to the turn)."""
    clock = Clock(NOW)
    limiter = MemoryLimiter(clock)
    events: list[tuple[float, int, Claimant, float]] = []  # (at, seq, claimant, sent)
    seq = itertools.count()
    for claimant, (connections, period) in demand.items():
        if period > 0:
            t = NOW
            while t < NOW + seconds:
                heapq.heappush(events, (t, next(seq), claimant, t))
                t += period
        for _ in range(connections):
            heapq.heappush(events, (NOW, next(seq), claimant, NOW))
    served: dict[str, int] = {c.key: 0 for c in demand}
    waits: dict[str, list[float]] = {c.key: [] for c in demand}
    while events:
        at, n, claimant, sent = heapq.heappop(events)
        if at >= NOW + seconds:
            break
        clock.now = at
        ask = GroupAsk(
            "g", [TEN_A_SECOND], estimate_cost(1), 60.0, f"r{n}", False, claimant, lookahead
        )
        verdict = limiter.reserve_now(ask)
        if verdict.deferred:
            heapq.heappush(events, (at + verdict.retry_after, n, claimant, sent))
            continue
        assert verdict.deployment_id is not None, verdict
        turn = at + verdict.wait
        if turn >= NOW + seconds / 4:
            served[claimant.key] += 1
        waits[claimant.key].append(turn - sent)
        if demand[claimant][1] == 0:  # a closed loop: the next request at the answer
            heapq.heappush(events, (turn, next(seq), claimant, turn))
    return served, waits


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


@pytest.mark.slow
def test_a_light_key_beside_a_heavy_one_waits_about_the_lookahead_and_the_model_stays_full() -> (
    None
):
    heavy, light = Claimant("heavy"), Claimant("light")
    served, waits = simulate({heavy: (40, 0.0), light: (0, 0.5)}, seconds=60)
    assert _p90(waits["light"]) <= 0.5 + 0.1 + 1e-6  # the lookahead and one turn
    total = served["heavy"] + served["light"]
    assert total >= 0.99 * 10 * 45  # the model kept busy: 10 a second for 45 s
    assert served["light"] == pytest.approx(90, abs=2)  # every light request, 2 a second


@pytest.mark.slow
def test_two_saturating_keys_share_by_weight() -> None:
    big, small = Claimant("big", 0, 3.0), Claimant("small", 0, 1.0)
    served, _ = simulate({big: (40, 0.0), small: (40, 0.0)}, seconds=80)
    total = served["big"] + served["small"]
    assert total >= 0.99 * 10 * 60
    assert served["big"] / total == pytest.approx(0.75, abs=0.05)


@pytest.mark.slow
def test_a_higher_tier_goes_first_while_a_lower_one_saturates() -> None:
    batch, urgent = Claimant("batch", 0), Claimant("urgent", 1)
    served, waits = simulate({batch: (40, 0.0), urgent: (0, 0.25)}, seconds=60)
    assert _p90(waits["urgent"]) <= 0.5 + 0.1 + 1e-6
    assert served["urgent"] == pytest.approx(180, abs=2)
    assert served["batch"] + served["urgent"] >= 0.99 * 10 * 45
