"""Where the spend report's totals live: Redis with the limiter's state, or this process.

The budgets themselves are quotas in the limiter (quota.py), exact and atomic; this is
the report (``GET /admin/spend``): per (key, team, model), the dollars, tokens and
requests of each day, week and month. A request's spend is summed here (``spend.Tally``)
and written once a second in one script call (``lua/record_spend.lua``, one hash per
period under ``{P:spend}``, kept two periods and a day), not once per request. A write
that fails is kept and tried again with the next; what is pending is written at
shutdown, so a restart loses none of it. Without Redis the totals live in this process
(each worker its own) and are forgotten on restart: start-up says so (config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from proxy.limiter.base import ManagedLimiter, Period
from proxy.limiter.core import periods
from proxy.limiter.policy import ResilientLimiter
from proxy.limiter.redis.runner import ScriptRunner
from proxy.spend import Owner, Spend, Tally

log = logging.getLogger(__name__)

FLUSH_EVERY = 1.0  # seconds between writes of the pending spend
KEEP_SLACK = 86400.0  # a period's totals outlive the next period by a day

Clock = Callable[[], float]


class Ledger(Protocol):
    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        """Count ``spend`` in the periods that ``started`` (UTC seconds) falls in."""
        ...

    async def totals(self, period: Period, index: int) -> dict[str, float]:
        """The stored totals of one period (``spend.field_name`` -> amount)."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class MemoryLedger:
    """The totals in this process (no Redis)."""

    def __init__(self) -> None:
        self._tally = Tally()
        self._today = -1

    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        today = self._tally.add(owner, spend, started)
        if today != self._today:  # once a day: days no report reads are forgotten
            self._today = today
            last_month = periods.index("month", started) - 1
            self._tally.forget_before(int(periods.start("month", last_month) // periods.DAY))

    async def totals(self, period: Period, index: int) -> dict[str, float]:
        return self._tally.totals().get((period, index), {})

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class RedisLedger:
    """The totals in the limiter's Redis, written once a second."""

    def __init__(self, runner: ScriptRunner, prefix: str, clock: Clock = time.time) -> None:
        self._runner = runner
        self._prefix = prefix
        self._clock = clock
        self._pending = Tally()
        self._task: asyncio.Task[None] | None = None

    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        self._pending.add(owner, spend, started)

    async def totals(self, period: Period, index: int) -> dict[str, float]:
        [flat] = await self._runner.run("read_spend", [self._key(period, index)], [])
        pairs = [_text(x) for x in flat]
        return {name: float(v) for name, v in zip(pairs[::2], pairs[1::2], strict=True)}

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="spend-ledger")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        """Write what is pending; on failure keep it for the next write."""
        taken = self._pending.take()
        if not taken.days:
            return
        keys: list[str] = []
        args: list[str] = []
        now = self._clock()
        for (period, index), fields in taken.totals().items():
            keep = periods.start(period, index + 2) - now + KEEP_SLACK
            keys.append(self._key(period, index))
            args += [str(max(1000, int(keep * 1000))), str(len(fields))]
            for name, amount in fields.items():
                args += [name, repr(amount)]
        try:
            await self._runner.run("record_spend", keys, args, urgent=False)
        except Exception as exc:  # StorageError and the like: kept, tried again
            log.warning("spend report not written yet (kept for the next try): %s", exc)
            self._pending.merge(taken)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self.flush()

    def _key(self, period: Period, index: int) -> str:
        return f"{{{self._prefix}:spend}}:{period}:{index}"


def create_ledger(limiter: ManagedLimiter) -> Ledger:
    """The ledger that goes with ``limiter``: in its Redis when it has one."""
    if isinstance(limiter, ResilientLimiter):
        shared = limiter.shared
        return RedisLedger(shared.runner, shared.prefix)
    return MemoryLedger()


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
