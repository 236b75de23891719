"""Where the spend report's totals live: Redis with the limiter's state, or this process.

The budgets themselves are quotas in the limiter (quota.py), exact and atomic; this is
the report (``GET /admin/spend``): per (key, team, model), the dollars, tokens and
requests of each day, week and month. A request's spend is summed here (``spend.Tally``)
and written once a second in one script call (``lua/record_spend.lua``, one hash per
period under ``{P:spend}``, kept two periods and a day, a day's ``DAYS_KEPT`` days: the
admin page shows this month day by day), not once per request. A write
that fails is kept and sent again, as it was, before anything newer; what is pending is
written at shutdown, so a restart loses none of it. A write that timed out may still
have run (Redis stalled, then read it): each write carries this ledger's id and a
sequence number, and the script adds a write only if its number is past the last one
it added for that ledger, so a retry counts nothing twice.

A background response's estimate is held (``spend.Held``: ``{P:spend}:held:<id>``,
written with the totals, kept as long as the upstream keeps the response) until its
usage is read; ``claim`` takes it (deletes it) once.
Without Redis the totals live in this process (each worker its own) and are forgotten
on restart: start-up says so (config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from proxy.limiter.base import ManagedLimiter, Period
from proxy.limiter.core import periods
from proxy.limiter.policy import ResilientLimiter
from proxy.limiter.redis.runner import ScriptRunner
from proxy.money.spend import Held, Owner, Spend, Tally
from proxy.values import value

log = logging.getLogger("proxy.limiter.ledger")

FLUSH_EVERY = 1.0  # seconds between writes of the pending spend
KEEP_SLACK = 86400.0  # a period's totals outlive the next period by a day
DAYS_KEPT = 32  # a day's totals: for as many days (the longest month, and today)
HELD_FOR = 30 * 86400.0  # a held estimate: as long as OpenAI keeps a stored response
MAX_HELD = 100_000  # held estimates one process keeps without Redis (the oldest go)

Clock = Callable[[], float]


class Ledger(Protocol):
    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        """Count ``spend`` in the periods that ``started`` (UTC seconds) falls in."""
        ...

    def hold(self, response_id: str, held: Held) -> None:
        """Keep ``held`` (already added as an estimate) until ``claim``: its usage is
        not known yet."""
        ...

    async def claim(self, response_id: str) -> Held | None:
        """What was held for ``response_id``, taken: one caller ever gets it, on any
        replica. None: nothing held (or not known here yet, or taken)."""
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
        self._held: OrderedDict[str, Held] = OrderedDict()

    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        today = self._tally.add(owner, spend, started)
        if today != self._today:  # once a day: days no report reads are forgotten
            self._today = today
            last_month = periods.index("month", started) - 1
            self._tally.forget_before(int(periods.start("month", last_month) // periods.DAY))

    def hold(self, response_id: str, held: Held) -> None:
        self._held[response_id] = held
        while len(self._held) > MAX_HELD:
            self._held.popitem(last=False)

    async def claim(self, response_id: str) -> Held | None:
        return self._held.pop(response_id, None)

    async def totals(self, period: Period, index: int) -> dict[str, float]:
        return self._tally.totals().get((period, index), {})

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


@value
class _Write:
    """One write of the totals (``record_spend``'s keys and arguments), numbered."""

    keys: list[str]
    args: list[str]
    holds: frozenset[str]  # the response ids whose estimates it holds


class RedisLedger:
    """The totals in the limiter's Redis, written once a second."""

    def __init__(self, runner: ScriptRunner, prefix: str, clock: Clock = time.time) -> None:
        self._runner = runner
        self._prefix = prefix
        self._clock = clock
        self._pending = Tally()
        self._holds: dict[str, Held] = {}  # estimates to hold, with the next write
        self._unsent: _Write | None = None  # failed: sent again, unchanged, before the next
        self._writer = uuid.uuid4().hex  # this ledger's writes are numbered under it
        self._sequence = 0
        self._flushing = asyncio.Lock()  # one flush at a time: each write sent in order
        self._task: asyncio.Task[None] | None = None

    def add(self, owner: Owner, spend: Spend, started: float) -> None:
        self._pending.add(owner, spend, started)

    def hold(self, response_id: str, held: Held) -> None:
        self._holds[response_id] = held

    async def claim(self, response_id: str) -> Held | None:
        held = self._holds.pop(response_id, None)
        if held is not None:  # never written: taken here
            return held
        if self._unsent is not None and response_id in self._unsent.holds:
            return None  # written or not, nobody can tell yet: a later read settles it
        try:
            [data] = await self._runner.run("claim_spend", [self._held_key(response_id)], [])
        except Exception as exc:  # taken or not: the estimate stays, in budget and report
            log.warning("held estimate of %s not settled: %s", response_id, exc)
            return None
        return None if data is None else Held.decode(data)

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
        """Write the write that failed last, then what is pending; a write that fails
        is kept to send again as it is (its number tells Redis whether it already
        ran), before anything newer."""
        async with self._flushing:
            for _ in range(2):
                if self._unsent is None:
                    self._unsent = self._next_write()
                    if self._unsent is None:
                        return
                if not await self._send(self._unsent):
                    return
                self._unsent = None

    def _next_write(self) -> _Write | None:
        """What is pending, as the next numbered write (None: nothing)."""
        taken = self._pending.take()
        holds, self._holds = self._holds, {}
        if not taken.days and not holds:
            return None
        self._sequence += 1
        now = self._clock()
        keys = [self._writer_key()]
        args = [str(self._sequence), "", str(len(holds))]
        longest = 0
        for (period, index), fields in taken.totals().items():
            kept = index + (DAYS_KEPT if period == "day" else 2)
            keep = max(1000, int((periods.start(period, kept) - now + KEEP_SLACK) * 1000))
            longest = max(longest, keep)
            keys.append(self._key(period, index))
            args += [str(keep), str(len(fields))]
            for name, amount in fields.items():
                args += [name, repr(amount)]
        # The mark outlives the totals it guards: no retry can come after them.
        args[1] = str(max(longest, int(HELD_FOR * 1000)))
        for response_id, held in holds.items():
            keys.append(self._held_key(response_id))
            args += [str(int(HELD_FOR * 1000)), held.encode().decode()]
        return _Write(keys, args, frozenset(holds))

    async def _send(self, write: _Write) -> bool:
        try:
            await self._runner.run("record_spend", write.keys, write.args, urgent=False)
        except Exception as exc:  # StorageError and the like: kept, tried again
            log.warning("spend report not written yet (kept for the next try): %s", exc)
            return False
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self.flush()

    def _key(self, period: Period, index: int) -> str:
        return f"{{{self._prefix}:spend}}:{period}:{index}"

    def _writer_key(self) -> str:
        return f"{{{self._prefix}:spend}}:writer:{self._writer}"

    def _held_key(self, response_id: str) -> str:
        return f"{{{self._prefix}:spend}}:held:{response_id}"


def create_ledger(limiter: ManagedLimiter) -> Ledger:
    """The ledger that goes with ``limiter``: in its Redis when it has one."""
    if isinstance(limiter, ResilientLimiter):
        shared = limiter.shared
        return RedisLedger(shared.runner, shared.prefix)
    return MemoryLedger()


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
