"""A budget: a quota for a calendar period, reserved before and settled after (pure).

A budget is a window whose rate is a calendar period (``periods.py``), not a refill
rate: at most ``limit`` units of one kind (``usd``, ``tokens``, ``requests``,
``input_tokens``, ``output_tokens``) per period, and nothing trickles back before the
boundary, where the whole amount returns. Its state is ``(period index, spent)``; a state
of an earlier period reads as nothing spent.

* ``check``: a request whose estimate does not fit (``spent + cost > limit``) is refused
  and nothing is charged anywhere; otherwise ``spent += cost`` in the current period.
  Done in the same atomic step as the key's other windows (both backends), so two
  requests can never both see the same room.
* ``settle``: the correction (real minus estimate) goes to the period the reservation
  *started* in. When that period is over, the budget's state has moved on and is left
  alone: the correction changes only that period's spend record (the report).

Why concurrency cannot overshoot: the reservation bounds the real cost (the caller
estimates by an upper bound and caps the output), every reservation is checked and
charged in one step against everything reserved before it, and a settlement only lowers
what was reserved. So the real spend of a period is at most the sum of admitted
reservations, which is at most the limit. ``lua/quota.lua`` mirrors this module line by
line; change both together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from proxy.limiter.base import Period, Quota, QuotaUsage
from proxy.limiter.core import periods
from proxy.values import value


def budget_label(quota: Quota) -> str:
    """How metrics name a budget: its 429 code, and its models when it has some
    (``key_budget_tokens_day:gpt-4o``)."""
    return f"{quota.code}:{','.join(quota.models)}" if quota.models else quota.code


def quota_name(kind: str, period: Period, models: Sequence[str] = ()) -> str:
    """``budget_usd_month``; a budget scoped to models is named by them too."""
    name = f"budget_{kind}_{period}"
    return f"{name}:{','.join(sorted(models))}" if models else name


@value
class QuotaState:
    """``spent`` units in period ``period`` (an index, ``periods.index``)."""

    period: int = -1
    spent: float = 0.0


EMPTY = QuotaState()


@value
class QuotaCheck:
    """``refused``: the index of the budget that refused (the one whose reset comes
    last among those that would refuse), -1 when allowed. ``retry_after``: seconds until
    it resets."""

    refused: int = -1
    retry_after: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.refused < 0


def spent_in(state: QuotaState, i: int) -> float:
    """What was spent in period ``i``: nothing when the state is of another period."""
    return state.spent if state.period == i else 0.0


def cost_of(quota: Quota, cost: Mapping[str, float]) -> float:
    """What a request costing ``cost`` (kind -> amount) costs in ``quota``."""
    return cost.get(quota.kind, 0.0)


def check(
    quotas: Sequence[Quota], states: Sequence[QuotaState], costs: Sequence[float], now: float
) -> tuple[list[QuotaState], QuotaCheck]:
    """Charge every budget its cost in its current period, or refuse and charge none."""
    refused, retry_after = -1, 0.0
    charged: list[QuotaState] = []
    for n, (q, state, cost) in enumerate(zip(quotas, states, costs, strict=True)):
        i = periods.index(q.period, now)
        spent = spent_in(state, i)
        if cost > 0 and spent + cost > q.limit:
            reset = periods.start(q.period, i + 1) - now
            if reset > retry_after or refused < 0:
                refused, retry_after = n, reset
        charged.append(QuotaState(i, spent + cost))
    if refused >= 0:
        return list(states), QuotaCheck(refused, retry_after)
    return charged, QuotaCheck()


def settle(state: QuotaState, quota: Quota, started: float, units: float) -> QuotaState | None:
    """``units`` (real minus estimate; negative refunds) added to the period that
    ``started`` (the reservation's time) falls in, never below zero; None when that
    period is no longer the state's (nothing to write). A charge for a period the state
    has not reached yet starts it: a request this store never reserved (admitted by a
    replica's fallback while it was down: policy.py) is charged what it cost."""
    i = periods.index(quota.period, started)
    if state.period != i and not (state.period < i and units > 0):
        return None
    return QuotaState(i, max(0.0, spent_in(state, i) + units))


def usage(state: QuotaState, quota: Quota, now: float) -> QuotaUsage:
    i = periods.index(quota.period, now)
    end = periods.start(quota.period, i + 1)
    return QuotaUsage(
        limit=quota.limit,
        remaining=max(0.0, quota.limit - spent_in(state, i)),
        reset=end - now,
        resets_at=end,
    )
