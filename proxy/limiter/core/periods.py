"""Calendar periods in UTC, as integers: the pure math of a budget's reset (pure).

A budget is a quota for a calendar period (``day``, ``week`` from Monday 00:00, civil
``month``), not a refill rate: the whole amount returns at the boundary. A period is
named by its *index*, a whole number that grows by one at each boundary, so a budget's
state is ``(index, spent)`` and a stale index means "nothing spent in this period".

Months use Howard Hinnant's days-from-civil arithmetic (integer divisions only), so
``lua/quota.lua`` mirrors this module line by line and both backends agree on every
boundary, leap years included. Change both together.
"""

from __future__ import annotations

import math

from proxy.limiter.base import Period
from proxy.values import value

PERIODS: tuple[Period, ...] = ("day", "week", "month")

DAY = 86400
# 1970-01-01 was a Thursday: day 0 is 3 days after the Monday that starts its week.
_EPOCH_WEEKDAY = 3


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm)."""
    year -= 1 if month <= 2 else 0
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The (year, month, day) of ``days`` since 1970-01-01 (Hinnant's inverse)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (1 if month <= 2 else 0), month, day


def index(period: Period, t: float) -> int:
    """The period ``t`` (UTC seconds) falls in: consecutive periods, consecutive indices."""
    days = math.floor(t / DAY)  # as Lua computes it: the same double, the same floor
    if period == "day":
        return days
    if period == "week":
        return (days + _EPOCH_WEEKDAY) // 7
    year, month, _ = civil_from_days(days)
    return year * 12 + month - 1


def start(period: Period, i: int) -> float:
    """When period ``i`` begins (UTC seconds); it ends where period ``i + 1`` begins."""
    if period == "day":
        return float(i * DAY)
    if period == "week":
        return float((i * 7 - _EPOCH_WEEKDAY) * DAY)
    return float(days_from_civil(i // 12, i % 12 + 1, 1) * DAY)


@value
class Span:
    """One period: its index and ``[start, end)`` in UTC seconds."""

    index: int
    start: float
    end: float


def span(period: Period, t: float) -> Span:
    """The period ``t`` falls in."""
    i = index(period, t)
    return Span(i, start(period, i), start(period, i + 1))


def until_reset(period: Period, t: float) -> float:
    """Seconds from ``t`` until the period it falls in ends (its budget returns)."""
    return start(period, index(period, t) + 1) - t
