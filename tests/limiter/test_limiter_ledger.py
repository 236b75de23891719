"""The spend report's totals: in the process, or in the limiter's Redis (written in one
call, kept and written later when Redis is away, written once however often a write is
sent again, and written at shutdown); estimates held until their usage is known, taken
once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import redis
from support.limits import patient
from support.redis_server import RedisServer

from proxy.limiter.core import periods
from proxy.limiter.redis.backend import RedisLimiter
from proxy.money.ledger import DAYS_KEPT, MemoryLedger, RedisLedger
from proxy.money.spend import Held, Owner, Spend, field_name

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
            return await _written(ledger, now, "usd", 7.0)  # once the client reconnects
        finally:
            await limiter.aclose()

    try:
        totals = asyncio.run(main())
    finally:
        server.kill()
    assert totals[field_name("usd", ALICE)] == 7.0
    assert totals[field_name("requests", ALICE)] == 3


async def _written(ledger: RedisLedger, now: float, field: str, amount: float) -> dict[str, float]:
    """The day's totals once ``field`` reads ``amount`` (flushing meanwhile; 5 s at most)."""
    for _ in range(50):
        await ledger.flush()
        totals = await _read(ledger, now)
        if totals.get(field_name(field, ALICE)) == amount:
            return totals
        await asyncio.sleep(0.1)
    return await _read(ledger, now)


async def _read(ledger: RedisLedger, now: float) -> dict[str, float]:
    try:
        return await ledger.totals("day", periods.index("day", now))
    except Exception:
        return {}


def test_a_write_cut_by_a_stall_and_sent_again_counts_once(tmp_path: Path) -> None:
    """A stopped Redis (SIGSTOP) keeps the write it was sent and runs it once it wakes;
    the ledger, which gave up on it, sends it again: the second copy adds nothing."""
    server = RedisServer(tmp_path / "redis").start()

    async def main() -> dict[str, float]:
        limiter = RedisLimiter(server.url)  # the proxy's short timeouts
        ledger = RedisLedger(limiter.runner, limiter.prefix)
        now = time.time()
        try:
            ledger.add(ALICE, Spend(1.0, 1, 1), now)
            await ledger.flush()  # the script is loaded
            ledger.add(ALICE, Spend(2.0, 1, 1), now)
            server.freeze()
            try:
                await ledger.flush()  # times out: kept, and sent again below
                ledger.add(ALICE, Spend(4.0, 1, 1), now)
                await ledger.flush()  # times out again
            finally:
                server.thaw()
            await _written(ledger, now, "requests", 3)  # Redis ran both; the retry landed
            await ledger.aclose()
            return await _read(ledger, now)
        finally:
            await limiter.aclose()

    try:
        totals = asyncio.run(main())
    finally:
        server.kill()
    assert (totals[field_name("usd", ALICE)], totals[field_name("requests", ALICE)]) == (7, 3)


HELD = Held(ALICE, 0.0, "d", Spend(0.5, 400, 256, estimated=1), {"usd": 0.5})


def test_an_estimate_held_in_memory_is_taken_once() -> None:
    ledger = MemoryLedger()
    ledger.hold("resp_1", HELD)
    assert asyncio.run(ledger.claim("resp_1")) == HELD
    assert asyncio.run(ledger.claim("resp_1")) is None
    assert asyncio.run(ledger.claim("resp_other")) is None


def test_an_estimate_held_in_redis_is_taken_once_by_any_replica(redis_url: str) -> None:
    async def main() -> list[Held | None]:
        limiter = patient(redis_url, prefix=f"ld{uuid.uuid4().hex}")
        one = RedisLedger(limiter.runner, limiter.prefix)
        other = RedisLedger(limiter.runner, limiter.prefix)
        try:
            one.hold("resp_local", HELD)
            taken = [await one.claim("resp_local")]  # not written yet: taken here
            one.hold("resp_1", HELD)
            taken.append(await other.claim("resp_1"))  # not written yet: unknown there
            await one.flush()
            taken += [await other.claim("resp_1"), await one.claim("resp_1")]
            await one.flush()  # nothing written again
            taken.append(await other.claim("resp_1"))
            return taken
        finally:
            await limiter.aclose()

    assert asyncio.run(main()) == [HELD, None, HELD, None, None]


def test_a_days_totals_are_kept_for_the_admin_pages_month_day_by_day(redis_url: str) -> None:
    """A day's totals outlive the longest month (the spend view shows this month day by
    day); a week's and a month's, the next period and a day."""
    prefix = f"ld{uuid.uuid4().hex}"

    async def main(now: float) -> None:
        limiter = patient(redis_url, prefix=prefix)
        ledger = RedisLedger(limiter.runner, limiter.prefix, clock=lambda: now)
        try:
            ledger.add(ALICE, Spend(0.5, 10, 20), now)
            await ledger.aclose()
        finally:
            await limiter.aclose()

    now = time.time()
    asyncio.run(main(now))
    with redis.Redis.from_url(redis_url) as client:
        day = client.pttl(f"{{{prefix}:spend}}:day:{periods.index('day', now)}") / 1000
        month = client.pttl(f"{{{prefix}:spend}}:month:{periods.index('month', now)}") / 1000
    # Set from ``now`` at the write, a TTL only goes down: at most what was set, and
    # more than a day's kept days (or the next month) however slow the test ran.
    today = periods.start("day", periods.index("day", now))
    assert DAYS_KEPT * periods.DAY < day <= today + (DAYS_KEPT + 1) * periods.DAY - now
    following = periods.start("month", periods.index("month", now) + 2)
    assert following - now - 31 * periods.DAY < month <= following + periods.DAY - now
