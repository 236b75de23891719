"""Choosing a deployment of a model group (pure): health gates, holds, least busy.

Every backend decides a reservation with :func:`select` (the Redis backend through
``lua/reserve_deployment.lua``, a mirror with this module's helpers written inline: the
same formulas in the same order), given each candidate's buckets (its windows, and its
learned window when it has one), health and, for ``least_busy``, in-flight count, all
read in one atomic step:

* a candidate that is too small for the request (``cost > capacity``) never takes it;
* a candidate cooling down after failures, or whose probe is out, is not reservable at
  all: reserving a turn at the end of a cooldown would bypass the half-open probe;
* a candidate held after a 429 is reservable, for a turn no sooner than its hold ends
  (its wait is the later of the hold and its budget's): the upstream said when;
* among the reservable, the soonest turn wins, list order among equals; waits are clamped
  at 0 so every candidate that can go now beats one that must wait. With ``least_busy``,
  the one with the fewest requests in flight among those that can go now (list order
  among equals), else the soonest turn as usual;
* the chosen one is charged when its turn is within ``max_wait``; if it was cooled and
  its cooldown is over (and no probe is out) this request is its probe.

Refused: ``retry_after`` is the soonest moment some candidate could take the request: a
reservable one's ``wait - max_wait``, a cooling one's ``max(out, wait - max_wait)`` (``out``:
until it may take a request; its budget must be within ``max_wait`` too). ``cooling``
says the health of some candidate that could take the request kept it from going in time
(cooling, probing, or held longer than ``max_wait``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.limiter.core.bucket import (
    Admission,
    Bucket,
    BucketState,
    Decision,
    Plan,
    charge,
    decide,
    plan,
)
from proxy.limiter.core.fairness import Deferral, FairView, defer, depth
from proxy.limiter.core.health import HEALTHY, Health, hold_for, unusable_for, wait_for
from proxy.values import value

__all__ = ["Candidate", "Selection", "pace", "select"]


@value
class Candidate:
    """One deployment offered the request: its buckets (its windows, then its learned
    window if any), its health, and its requests in flight (only read for ``least_busy``)."""

    buckets: Sequence[Bucket]
    health: Health = HEALTHY
    in_flight: int = 0


@value
class Selection:
    index: int  # the chosen candidate, -1 when none was charged
    states: list[BucketState]  # the chosen candidate's new bucket states (empty when none)
    decision: Decision  # ALLOWED (wait), REFUSED (retry_after) or TOO_LARGE
    waits: list[float]  # per candidate: seconds until it could take it (inf: too large)
    probe: bool = False  # the chosen candidate was cooled: this request is its probe
    cooling: bool = False  # refused while a candidate that could take it was held
    deferral: Deferral | None = None  # refused for fairness: ask again (fairness.py)


def select(
    candidates: Sequence[Candidate],
    now: float,
    max_wait: float,
    least_busy: bool = False,
    fair: FairView | None = None,
) -> Selection:
    """The candidate a request reserves a turn on and its charge, or why none (the rules
    above)."""
    if not candidates:
        raise ValueError("select needs at least one candidate")
    plans = [plan(c.buckets, now) for c in candidates]
    survey = _survey(candidates, plans, now, max_wait)
    waits = survey.waits
    best = _choose(candidates, survey, least_busy)
    if best < 0:
        return _none_reservable(plans, survey)
    best_plan = plans[best]
    turn = Plan(best_plan.debts, waits[best], best_plan.binding, best_plan.too_large)
    decision = decide(turn, max_wait)
    if not decision.allowed:
        retry = min(decision.retry_after, survey.cooling_retry)
        refused = Decision(Admission.REFUSED, retry_after=retry, binding=decision.binding)
        return Selection(-1, [], refused, waits, cooling=survey.cooling or survey.held_back[best])
    if fair is not None and decision.wait > 0.0:
        deferral = _deferral(candidates, survey.reservable, decision.wait, fair, now)
        if deferral is not None:
            refused = Decision(
                Admission.REFUSED, retry_after=deferral.retry_after, binding=decision.binding
            )
            return Selection(-1, [], refused, waits, deferral=deferral)
    chosen = candidates[best]
    states = charge(chosen.buckets, turn, now)
    return Selection(best, states, decision, waits, probe=chosen.health.cooling)


@value
class _Survey:
    """Per candidate: its wait, whether it is reservable, whether its hold is past
    ``max_wait``; and whether some candidate is cooling, and when it could take it."""

    waits: list[float]
    reservable: list[bool]
    held_back: list[bool]  # reservable, but held after a 429 longer than max_wait
    cooling: bool
    cooling_retry: float


def _survey(
    candidates: Sequence[Candidate], plans: Sequence[Plan], now: float, max_wait: float
) -> _Survey:
    """Each candidate's wait and standing: what the choice and a refusal are made of."""
    waits: list[float] = []
    reservable: list[bool] = []
    held_back: list[bool] = []
    cooling = False
    cooling_retry = math.inf
    for c, p in zip(candidates, plans, strict=True):
        if p.too_large >= 0:
            waits.append(math.inf)
            reservable.append(False)
            held_back.append(False)
            continue
        hold = hold_for(c.health, now)
        if wait_for(c.health, now) == 0.0:
            waits.append(max(hold, p.wait))
            reservable.append(True)
            # Only a hold beyond max_wait is the health's doing; within it, a turn
            # refused is refused for want of budget (the learned pace's queue).
            held_back.append(hold > max_wait)
        else:
            out = unusable_for(c.health, now)
            waits.append(max(out, p.wait))
            reservable.append(False)
            held_back.append(False)
            cooling = True
            cooling_retry = min(cooling_retry, max(out, p.wait - max_wait))
    return _Survey(waits, reservable, held_back, cooling, cooling_retry)


def _choose(candidates: Sequence[Candidate], survey: _Survey, least_busy: bool) -> int:
    """The candidate to reserve: with ``least_busy`` the least busy that can go now, else
    (or if none can) the soonest turn; -1 if none is reservable."""
    best = _least_busy(candidates, survey) if least_busy else -1
    return best if best >= 0 else _soonest(survey)


def _least_busy(candidates: Sequence[Candidate], survey: _Survey) -> int:
    """``least_busy``: among the reservable that can go now, the one with the fewest
    requests in flight (list order among equals); -1 if none can go now."""
    best = -1
    for i, c in enumerate(candidates):
        if (
            survey.reservable[i]
            and survey.waits[i] == 0.0
            and (best < 0 or c.in_flight < candidates[best].in_flight)
        ):
            best = i
    return best


def _soonest(survey: _Survey) -> int:
    """The reservable candidate with the soonest turn (list order among equals); -1 if
    none is reservable."""
    best = -1
    for i, w in enumerate(survey.waits):
        if survey.reservable[i] and (best < 0 or w < survey.waits[best]):
            best = i
    return best


def _none_reservable(plans: Sequence[Plan], survey: _Survey) -> Selection:
    """No candidate reservable: refused until a cooling one could take it, else too
    large for all of them (the first one's binding bucket)."""
    if not survey.cooling:
        return Selection(
            -1, [], Decision(Admission.TOO_LARGE, binding=plans[0].too_large), survey.waits
        )
    return Selection(
        -1,
        [],
        Decision(Admission.REFUSED, retry_after=survey.cooling_retry),
        survey.waits,
        cooling=True,
    )


def _deferral(
    candidates: Sequence[Candidate],
    reservable: Sequence[bool],
    wait: float,
    fair: FairView,
    now: float,
) -> Deferral | None:
    """Fair share: whether the claimant's turn, ``wait`` away, is deferred for keys that
    had fewer turns (fairness.py), over the turns the reservable candidates hold."""
    paces = [pace(c.buckets) for c, ok in zip(candidates, reservable, strict=True) if ok]
    turns = depth(paces, fair.lookahead)
    return defer(fair.claimant, wait, fair.held, fair.waiting, turns, fair.lookahead, now)


def pace(buckets: Sequence[Bucket]) -> float:
    """Seconds one request like this one occupies a deployment at its steady rate."""
    return max((b.cost * b.interval for b in buckets), default=0.0)
