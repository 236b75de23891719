"""The spend report's totals: in the process, or in the limiter's Redis (written in one
call, kept and written later when Redis is away, and written at shutdown)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from support.limits import patient
from support.redis_server import RedisServer

from proxy.limiter.core import periods
from proxy.limiter.ledger import MemoryLedger, RedisLedger
from proxy.spend import Owner, Spend, field_name

ALICE = Owner("alice", "", "m")


def test_the_memory_ledger_reports_what_was_added() -> None:
    ledger = MemoryLedger()
    now = time.time()
    ledger.add(ALICE, Spend(0.5, 10, 20), now)
    ledger.add(ALICE, Spend(0.25, 10, 20), now)
    totals = asyncio.run(ledger.totals("month", periods.index("month", now)))
    assert totals[field_name("usd", ALICE)] == 0.75
    assert totals[field_name("requests", ALICE)] == 2


def test_the_redis_ledger_writes_in_one_call_and_reads_back(redis_url: str) -> None:
    async def main() -> dict[str, float]:
        limiter = patient(redis_url, prefix=f"ld{uuid.uuid4().hex}")
        ledger = RedisLedger(limiter.runner, limiter.prefix)
        now = time.time()
        try:
            ledger.add(ALICE, Spend(0.5, 10, 20), now)
            await ledger.flush()
            ledger.add(ALICE, Spend(0.25, 1, 2), now)
            await ledger.aclose()  # writes what is pending
            return await ledger.totals("week", periods.index("week", now))
        finally:
            await limiter.aclose()

    totals = asyncio.run(main())
    assert totals[field_name("usd", ALICE)] == 0.75
    assert totals[field_name("output_tokens", ALICE)] == 22


def test_spend_written_while_redis_is_away_is_kept_and_written_when_it_is_back(
    tmp_path: Path,
) -> None:
    # Persisting (AOF), so what was written before the restart is still there.
    server = RedisServer(tmp_path / "redis", None, "--appendonly", "yes").start()

    async def main() -> dict[str, float]:
        limiter = patient(server.url)
        ledger = RedisLedger(limiter.runner, limiter.prefix)
        now = time.time()
        try:
            ledger.add(ALICE, Spend(1.0, 1, 1), now)
            await ledger.flush()
            server.stop()
            ledger.add(ALICE, Spend(2.0, 1, 1), now)
            await ledger.flush()  # fails: kept
            server.start()
            ledger.add(ALICE, Spend(4.0, 1, 1), now)
            for _ in range(50):  # the client reconnects
                await ledger.flush()
                totals = await _read(ledger, now)
                if totals.get(field_name("usd", ALICE)) == 7.0:
                    return totals
                await asyncio.sleep(0.1)
            return await _read(ledger, now)
        finally:
            await limiter.aclose()

    try:
        totals = asyncio.run(main())
    finally:
        server.kill()
    assert totals[field_name("usd", ALICE)] == 7.0
    assert totals[field_name("requests", ALICE)] == 3


async def _read(ledger: RedisLedger, now: float) -> dict[str, float]:
    try:
        return await ledger.totals("day", periods.index("day", now))
    except Exception:
        return {}
