"""What a request's key is charged and settles to, when a fallback group serves it too.

The key's check (pipeline.py) takes the windows and budgets of the key and its team that
count the model group asked for (``Catalog.ask_limits``). When a fallback group is tried,
the model that serves counts the request, as if it had been asked for:

    before a fallback group is tried (the dispatcher): ``FallbackCharge.admit``
      -> the windows and budgets that count its model and not the one asked for
         (``Catalog.fallback_limits``) are taken, with the request's estimate and its
         budgets' reservation; refused, the fallback is not tried and nothing is taken
    once answered: ``FallbackCharge.settlements``, beside the check's own settlement
      -> those settle to the real usage, as the check's windows and budgets do
      -> the check's windows and budgets that count only the model asked for go back to
         what a request that failed there leaves them: its tokens and dollars returned,
         its request still counted in windows (as any failed request is)

A fallback that was taken and did not serve (the next one is tried) gives back what it
took as a failed request's, before the next one is asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from proxy.config import limit_kinds
from proxy.costs import Cost
from proxy.limiter.base import KeyLimits, KeySettlement, KeyVerdict
from proxy.limiter.core.verdicts import settled_cost
from proxy.money.pricing import FREE, Price
from proxy.pipeline import budgets
from proxy.request.call import Call

__all__ = ["FallbackCharge", "settlement"]

# Takes ``limits`` for the request under a slot of its own: the verdict (None: nothing
# taken, a shadow key's refusal), or the refusal raised.
Acquire = Callable[[KeyLimits, str], Awaitable[KeyVerdict | None]]
Settle = Callable[[KeySettlement], Awaitable[object]]
# A fallback group's (taken, given back): ``Catalog.fallback_limits`` for the request.
LimitsFor = Callable[[str], tuple[KeyLimits, KeyLimits]]


def settlement(
    call: Call,
    limits: KeyLimits,
    slot: str,
    started: float,
    prices: Mapping[str, Price],
    *,
    failed: bool = False,
    reserved: Cost | None = None,
) -> KeySettlement:
    """What ``limits``, taken for ``call`` under ``slot`` at ``started``, settle to: its
    real usage (``failed``: none, as a failed request's), its budgets' reservation
    (``reserved``, if not ``call.admission.reserved``: a fallback's own) corrected to its real
    cost at the price of the deployment that answered (``prices``: by deployment id;
    unpriced: free)."""
    used = None if failed else limit_kinds.settled(call.ask.cost, call.trip.charged)
    correction = settled_cost(call.ask.cost, used, limits.all_windows)
    if not call.admission.reserved:
        return KeySettlement(limits, slot, correction)
    if reserved is None:
        reserved = call.admission.reserved
    real = None
    if not failed:
        price = prices.get(call.trip.deployment or "", FREE)
        real = budgets.settled_cost(call, price, reserved)
    cost = budgets.correction(real, reserved)
    return KeySettlement(limits, slot, correction, budget_cost=cost, started=started)


@dataclass(slots=True)
class Moved:
    """The key's charge for fallback group ``group``: ``added`` taken under ``slot``
    (``check``: its verdict to come; None: nothing to take), ``dropped``: the model
    asked for's only."""

    group: str
    added: KeyLimits
    dropped: KeyLimits
    slot: str
    check: asyncio.Future[KeyVerdict | None] | None = None


class FallbackCharge:
    """Per request whose key (or team) has windows or budgets of some models only, for a
    group with fallbacks; ``prices``: by deployment id."""

    def __init__(
        self,
        call: Call,
        limits_for: LimitsFor,
        acquire: Acquire,
        settle: Settle,
        prices: Mapping[str, Price],
    ) -> None:
        self._call = call
        self._limits_for = limits_for
        self._acquire = acquire
        self._settle = settle
        self._prices = prices
        self.moved: Moved | None = None

    async def admit(self, group: str) -> None:
        """Before fallback group ``group`` is tried (again): what it costs the key beyond
        the model asked for, taken once; raises the refusal, nothing taken."""
        moved = self.moved
        if moved is not None and moved.group == group:
            return
        if moved is not None:  # the fallback before did not serve
            self.moved = None
            verdict = await _taken(moved.check)
            if verdict is not None:
                call, slot = self._call, moved.slot
                own = budgets.bound_now(call)  # (what its ask took: the cap not lowered since)
                failed = settlement(
                    call, moved.added, slot, verdict.at, {}, failed=True, reserved=own
                )
                await self._settle(failed)
        added, dropped = self._limits_for(group)
        slot = f"{self._call.arrival.request_id}>{group}"
        check = None if added.unlimited else asyncio.ensure_future(self._acquire(added, slot))
        self.moved = Moved(group, added, dropped, slot, check)
        if check is None:
            return
        try:
            # Shielded: a request cancelled meanwhile is settled once its verdict is in.
            await asyncio.shield(check)
        except Exception:
            self.moved = None  # refused (or unknown to the limiter): nothing to settle
            raise

    async def settlements(self, main: KeySettlement | None) -> list[KeySettlement]:
        """What the answer settles beyond the check's own ``main`` (None: it took
        nothing), in order after it."""
        moved = self.moved
        if moved is None:
            return []
        call, prices = self._call, self._prices
        verdict = await _taken(moved.check)
        out = []
        if verdict is not None:
            own = budgets.bound_now(call)  # its ask's reservation, at the cap it went with
            out.append(settlement(call, moved.added, moved.slot, verdict.at, prices, reserved=own))
        if main is None or moved.dropped.unlimited:
            return out
        failed = settlement(call, moved.dropped, main.slot, main.started, prices, failed=True)
        cost = _minus(failed.cost, main.cost)
        budget_cost = _minus(failed.budget_cost, main.budget_cost)
        if cost or budget_cost:  # (none when it failed anyway)
            # Its own slot: never the request's (held in max_parallel) nor a lease's.
            slot = f"{main.slot}<"
            out.append(KeySettlement(moved.dropped, slot, cost, budget_cost, main.started))
        return out


def _minus(a: Cost, b: Cost) -> dict[str, float]:
    """``a - b`` per kind of either, where it is not 0 (what turns a correction ``b``
    already applied into ``a``)."""
    out = {kind: a.get(kind, 0.0) - b.get(kind, 0.0) for kind in {*a, *b}}
    return {kind: amount for kind, amount in out.items() if amount}


async def _taken(check: asyncio.Future[KeyVerdict | None] | None) -> KeyVerdict | None:
    """The verdict of ``check`` once in, if it took the request's share."""
    if check is None:
        return None
    if not check.done():
        await asyncio.wait((check,))
    if check.cancelled() or check.exception() is not None:
        return None
    return check.result()
