"""Routing strategies (pure): put a group's deployments in order of preference.

The limiter then reserves budget on the first candidate that can go now, or else on the
one whose turn comes soonest, so every strategy is also budget-aware: an order is a
preference, never a promise to send to a deployment that has no budget.

``STRATEGIES`` maps each name the config allows (``config.Strategy``, the contract's
list) to the function that orders for it; an import-time check keeps the two equal.
``weighted-random`` is another name for ``least-wait``, as LiteLLM users know it: since
the limiter already prefers whoever can go now, a weighted random order among them is
all either needs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, get_args

from proxy.config.settings import Strategy

__all__ = ["STRATEGIES", "RoutingState", "first_asked", "order_candidates", "weighted_shuffle"]

# Share of requests that try a deployment other than the fastest, so a recovered
# (or never measured) deployment gets measured again.
EXPLORATION = 0.05
# Of a larger group, ``least-wait`` first asks the limiter about this many deployments
# (the head of its weighted order: the power of d choices, as Envoy's least-request
# balancer), and about all of them only when none of these has a turn within the
# request's wait. The limiter reads each candidate it is asked about (its health and
# windows: a Redis round trip's main cost), so a group of 10 costs about a third as much.
SAMPLED = 3


class Candidate(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def weight(self) -> float: ...


C = TypeVar("C", bound=Candidate)


@dataclass
class RoutingState:
    """What this process knows that a strategy may order by."""

    in_flight: Mapping[str, int] = field(default_factory=dict)
    latency: Mapping[str, float] = field(default_factory=dict)  # moving average, seconds


def weighted_shuffle(candidates: Sequence[C], rng: random.Random) -> list[C]:
    """A random order where each position is drawn in proportion to weight
    (Efraimidis-Spirakis: sort by u ** (1 / w))."""
    keyed = [(math.log(1.0 - rng.random()) / c.weight, i) for i, c in enumerate(candidates)]
    keyed.sort(reverse=True)
    return [candidates[i] for _, i in keyed]


def _least_wait(candidates: Sequence[C], rng: random.Random, state: RoutingState) -> list[C]:
    # The limiter picks the soonest turn; ties are broken in proportion to weight, so
    # idle deployments share the load as configured.
    return weighted_shuffle(candidates, rng)


def _least_busy(candidates: Sequence[C], rng: random.Random, state: RoutingState) -> list[C]:
    busy = state.in_flight
    # Shuffle first so ties spread evenly instead of always favouring the first.
    shuffled = weighted_shuffle(candidates, rng)
    return sorted(shuffled, key=lambda c: busy.get(c.id, 0) / c.weight)


def _lowest_latency(candidates: Sequence[C], rng: random.Random, state: RoutingState) -> list[C]:
    shuffled = weighted_shuffle(candidates, rng)
    if rng.random() < EXPLORATION:
        return shuffled
    seen = state.latency
    # Unmeasured deployments sort first: they must be measured once.
    return sorted(shuffled, key=lambda c: seen.get(c.id, 0.0))


def first_asked(strategy: Strategy, ordered: Sequence[C]) -> Sequence[C] | None:
    """The candidates to ask about first (None: all of them at once)."""
    if len(ordered) <= SAMPLED or STRATEGIES[strategy] is not _least_wait:
        return None
    return ordered[:SAMPLED]


Orderer = Callable[[Sequence[C], random.Random, RoutingState], list[C]]

STRATEGIES: dict[Strategy, Orderer[Candidate]] = {
    "least-wait": _least_wait,
    "weighted-random": _least_wait,
    "least-busy": _least_busy,
    "lowest-latency": _lowest_latency,
}


if set(STRATEGIES) != set(get_args(Strategy)):  # pragma: no cover - a developer's slip
    raise ImportError("routing strategies and config.Strategy name different strategies")


def order_candidates(
    strategy: Strategy, candidates: Sequence[C], rng: random.Random, state: RoutingState
) -> list[C]:
    """Candidates in order of preference for ``strategy``."""
    if len(candidates) <= 1:
        return list(candidates)
    order: Orderer[C] = STRATEGIES[strategy]  # type: ignore[assignment]
    return order(candidates, rng, state)
