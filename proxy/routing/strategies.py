"""Routing strategies (pure): put a group's deployments in order of preference.

The limiter then reserves budget on the first candidate that can go now, or else on the
one whose turn comes soonest, so every strategy is also budget-aware: an order is a
preference, never a promise to send to a deployment that has no budget.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, TypeVar

Strategy = Literal["least-wait", "weighted-random", "least-busy", "lowest-latency"]

# Share of requests that try a deployment other than the fastest, so a recovered
# (or never measured) deployment gets measured again.
EXPLORATION = 0.05


class Candidate(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def weight(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def weighted_shuffle(candidates: Sequence[C], rng: random.Random) -> list[C]:
    """A random order where each position is drawn in proportion to weight
    (Efraimidis-Spirakis: sort by u ** (1 / w))."""
    keyed = [(math.log(1.0 - rng.random()) / c.weight, i) for i, c in enumerate(candidates)]
    keyed.sort(reverse=True)
    return [candidates[i] for _, i in keyed]


def order_candidates(
    strategy: Strategy,
    candidates: Sequence[C],
    rng: random.Random,
    in_flight: Mapping[str, int] | None = None,
    latency: Mapping[str, float] | None = None,
) -> list[C]:
    """Candidates in order of preference for ``strategy``."""
    if len(candidates) <= 1:
        return list(candidates)
    if strategy == "weighted-random":
        return weighted_shuffle(candidates, rng)
    if strategy == "least-busy":
        busy = in_flight or {}
        # Shuffle first so ties spread evenly instead of always favouring the first.
        shuffled = weighted_shuffle(candidates, rng)
        return sorted(shuffled, key=lambda c: busy.get(c.id, 0) / c.weight)
    if strategy == "lowest-latency":
        shuffled = weighted_shuffle(candidates, rng)
        if rng.random() < EXPLORATION:
            return shuffled
        seen = latency or {}
        # Unmeasured deployments sort first: they must be measured once.
        return sorted(shuffled, key=lambda c: seen.get(c.id, 0.0))
    # least-wait: the limiter picks the soonest turn; ties are broken in proportion to
    # weight, so idle deployments share the load as configured.
    return weighted_shuffle(candidates, rng)
