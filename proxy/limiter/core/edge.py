"""A budget's edge: a request it cannot pay whole sent with a lower output cap (pure).

A budget reserves an upper bound of a request's cost (quota.py). Most of that bound is
the output cap, so a key with a little budget left would be refused with it unspent.
A budget whose owner says ``budget_edge: clamp`` (``Quota.clamp``) lowers the cap
instead, to what it has left can pay, inside the same atomic step as every check:

    the bound at cap c, per kind:   base + per * c            (``Clamp``, base.py)
    the cap charged:                c = min(most, each clamping budget's
                                            floor((limit - spent - base) / per))
    below ``least`` for a budget:   c = most, and that budget refuses as it always did

Every budget of the ask (clamping or not) is then checked and charged ``base + per * c``
by ``quota.check``, all or nothing. So nothing overshoots (the request is sent with cap
``c``, and ``base + per * c`` bounds what it can cost), and a clamping budget is used to
its last output token: only a request whose input bound plus ``least`` output tokens no
longer fits is refused. ``lua/quota.lua`` (``quota_fit``) mirrors ``fit`` line by line,
the same operations in the same order (bit-identical floats); change both together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from proxy.costs import Cost
from proxy.limiter.base import Clamp, Quota
from proxy.limiter.core import periods
from proxy.limiter.core.quota import QuotaState, cost_of, spent_in

__all__ = ["charge", "costs_at", "fit", "reserved"]


def at(clamp: Clamp, cap: int) -> dict[str, float]:
    """The bound of a request of ``clamp`` sent with cap ``cap``, per kind."""
    base, per = clamp.base, clamp.per
    return {kind: base.get(kind, 0.0) + per.get(kind, 0.0) * cap for kind in {*base, *per}}


def fit(quotas: Sequence[Quota], states: Sequence[QuotaState], clamp: Clamp, now: float) -> int:
    """The cap a request of ``clamp`` is charged (and sent) with: ``clamp.most``, lowered
    to what each clamping budget has left pays; ``clamp.most`` again when one cannot pay
    ``clamp.least`` (``quota.check`` then refuses it, as at the edge ``refuse``)."""
    cap = clamp.most
    for q, state in zip(quotas, states, strict=True):
        per = cost_of(q, clamp.per)
        if not q.clamp or per <= 0.0:
            continue
        base = cost_of(q, clamp.base)
        spent = spent_in(state, periods.index(q.period, now))
        if spent + (base + per * cap) <= q.limit:
            continue
        left = q.limit - spent - base
        if left < per * clamp.least:
            return clamp.most
        cap = min(cap, math.floor(left / per))
        while cap >= clamp.least and spent + (base + per * cap) > q.limit:
            cap -= 1  # (a rounding: the division's last bit)
        if cap < clamp.least:
            return clamp.most
    return cap


def costs_at(quotas: Sequence[Quota], clamp: Clamp, cap: int) -> list[float]:
    """What each of ``quotas`` is charged for a request of ``clamp`` sent with ``cap``."""
    return [cost_of(q, clamp.base) + cost_of(q, clamp.per) * cap for q in quotas]


def charge(
    quotas: Sequence[Quota], states: Sequence[QuotaState], clamp: Clamp, now: float
) -> tuple[list[float], int]:
    """What each budget is charged (``quota.check``'s costs), and the cap lowered to
    (0: not lowered)."""
    cap = fit(quotas, states, clamp, now)
    return costs_at(quotas, clamp, cap), cap if cap < clamp.most else 0


def reserved(budget_cost: Mapping[str, float], clamp: Clamp | None, cap: int) -> Cost:
    """What an ask's budgets were charged, per kind: its ``budget_cost``, or its
    clamp's bound at ``cap`` when the verdict lowered it (``KeyVerdict.cap``)."""
    if clamp is None or not cap:
        return budget_cost
    return at(clamp, cap)
