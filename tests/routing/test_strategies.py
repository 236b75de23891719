"""Routing strategies order a group's deployments by preference."""

import random
from collections import Counter
from dataclasses import dataclass

from proxy.routing.strategies import (
    SAMPLED,
    RoutingState,
    first_asked,
    order_candidates,
    weighted_shuffle,
)


@dataclass(frozen=True)
class D:
    id: str
    weight: float = 1.0


def test_weighted_shuffle_leads_in_proportion_to_weight() -> None:
    rng = random.Random(7)
    deployments = [D("a", 3.0), D("b", 1.0)]
    firsts = Counter(weighted_shuffle(deployments, rng)[0].id for _ in range(4000))
    assert abs(firsts["a"] / 4000 - 0.75) < 0.03


def test_least_busy_prefers_fewest_in_flight() -> None:
    rng = random.Random(1)
    order = order_candidates(
        "least-busy",
        [D("a"), D("b"), D("c")],
        rng,
        RoutingState(in_flight={"a": 5, "b": 0, "c": 2}),
    )
    assert [d.id for d in order] == ["b", "c", "a"]


def test_lowest_latency_measures_unmeasured_first_and_explores() -> None:
    rng = random.Random(3)
    deployments = [D("fast"), D("slow"), D("new")]
    latency = {"fast": 0.1, "slow": 2.0}
    firsts = Counter(
        order_candidates("lowest-latency", deployments, rng, RoutingState(latency=latency))[0].id
        for _ in range(1000)
    )
    assert firsts["new"] > 900
    firsts = Counter(
        order_candidates("lowest-latency", deployments[:2], rng, RoutingState(latency=latency))[
            0
        ].id
        for _ in range(2000)
    )
    assert firsts["fast"] > 1800 and firsts["slow"] > 0


def test_every_strategy_returns_every_candidate_once() -> None:
    rng = random.Random(0)
    deployments = [D(str(i), i + 1.0) for i in range(5)]
    for strategy in ("least-wait", "weighted-random", "least-busy", "lowest-latency"):
        order = order_candidates(strategy, deployments, rng, RoutingState())
        assert sorted(d.id for d in order) == sorted(d.id for d in deployments)


def test_least_wait_asks_about_the_head_of_a_large_group_first() -> None:
    """The power of d choices: of more than ``SAMPLED`` deployments, the head of the
    weighted order first; a small group, and the strategies that rank by what this
    process saw, are asked about whole."""
    many = [D(f"d{i}") for i in range(10)]
    assert first_asked("least-wait", many) == many[:SAMPLED]
    assert first_asked("weighted-random", many) == many[:SAMPLED]
    assert first_asked("least-wait", many[:SAMPLED]) is None
    assert first_asked("least-busy", many) is None
    assert first_asked("lowest-latency", many) is None
