"""Fair share of a saturated model between client keys (pure; injected times).

A reservation commits an exact turn, so whoever holds the turns of the next seconds is
served first. Left alone, a key with many requests in a closed loop holds every turn up
to ``max_wait`` ahead and a key sending now and then waits behind all of them. Fairness
here is a bound on how far ahead turns are committed, and on each key's part of them:

* **Lookahead.** A turn more than ``lookahead`` seconds ahead is not committed: the
  request is *deferred* (nothing charged) and asks again when the schedule has drained
  to the lookahead. A request that can go now is never deferred, so an idle or lightly
  used model works exactly as before.
* **Shares.** While other keys of the same tier are deferred (waiting without a turn), a
  key may hold at most its share of the committed turns: ``weight / (sum of the weights
  of the waiting keys, its own included)`` of the turns that fit in the lookahead,
  rounded down, and always at least one. (So shares are as fine as the lookahead is
  deep in turns: 5 turns split 3:1 exactly, 2:1 as 3:1.) A key over its share is
  deferred until its own earliest turn has passed. Nobody else waiting: no share
  applies (work-conserving).
* **Tiers.** While a key of a higher ``priority`` is deferred, no lower-tier key gets a
  turn that must wait. A lower tier is not protected from starving: it gets turns only
  when the higher tiers leave some (give a high-priority key its own ``rpm`` to bound it).

A deferred key registers as *waiting* until a little after it is due to ask again
(``WAITING_MARGIN``); a key that gets a turn stops waiting. So the turns of the next
``lookahead`` seconds are split among the keys that want them in proportion to their
weights, and a key that arrives at a saturated model waits about ``lookahead``, not the
heavy key's whole backlog. The cost: a request that waits asks once more per deferral
(one more round trip), at a time computed from the schedule (no polling).

``lua/fairness.lua`` mirrors this module line by line for the Redis backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from proxy.limiter.base import Claimant
from proxy.values import value

__all__ = [
    "WAITING_MARGIN",
    "Deferral",
    "FairView",
    "Waiter",
    "defer",
    "depth",
    "waiting_until",
]

WAITING_MARGIN = 0.5  # seconds a deferred key stays registered past its next ask
MIN_RETRY = 0.005  # never ask again sooner than this (a clock tick, not a poll)
SLACK = 1e-6  # a turn this close to the lookahead's end is within it (float rounding)


@value
class Waiter:
    """A key that was deferred: waiting without a turn until at least ``until``."""

    tier: int
    weight: float
    until: float


@value
class Deferral:
    """Do not commit the turn; ask again after ``retry_after`` seconds. ``reason``:
    ``"lookahead"``, ``"share"`` or ``"tier"`` (for logs and tests)."""

    retry_after: float
    reason: str


@value
class FairView:
    """What a reservation reads for fairness: the claimant, its committed turns still
    ahead (ascending), the keys waiting without a turn (unexpired), the lookahead."""

    claimant: Claimant
    held: Sequence[float]
    waiting: Mapping[str, Waiter]
    lookahead: float


def depth(turn_seconds: Sequence[float], lookahead: float) -> float:
    """How many turns fit in ``lookahead`` across deployments whose turns last
    ``turn_seconds`` each (a turn lasting 0 seconds: unlimited)."""
    total = 0.0
    for seconds in turn_seconds:
        if seconds <= 0.0:
            return math.inf
        total += lookahead / seconds
    return total


def defer(
    claimant: Claimant,
    wait: float,
    held: Sequence[float],
    waiting: Mapping[str, Waiter],
    turns: float,
    lookahead: float,
    now: float,
) -> Deferral | None:
    """Should the turn ``wait`` seconds from now be deferred? None: commit it.

    ``held``: the claimant's committed turns still ahead (times, ascending);
    ``waiting``: the deferred keys (unexpired, the claimant possibly among them);
    ``turns``: how many turns fit in the lookahead (``depth``)."""
    if wait <= 0.0:
        return None
    tier_weight = claimant.weight
    for key, waiter in sorted(waiting.items()):  # one order: the sum is bit-identical
        if key == claimant.key:
            continue
        if waiter.tier > claimant.tier:
            return Deferral(max(wait - lookahead, MIN_RETRY), "tier")
        if waiter.tier == claimant.tier:
            tier_weight += waiter.weight
    if wait > lookahead + SLACK:
        return Deferral(max(wait - lookahead, MIN_RETRY), "lookahead")
    share = max(1.0, turns * claimant.weight / tier_weight)
    if held and len(held) + 1 > share + SLACK:
        return Deferral(max(held[0] - now, MIN_RETRY), "share")
    return None


def waiting_until(deferral: Deferral, now: float) -> float:
    """Until when a key just deferred counts as waiting."""
    return now + deferral.retry_after + WAITING_MARGIN
