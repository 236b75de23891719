"""Calendar periods in UTC: a budget's reset falls exactly on the calendar's boundary."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.limits import at

from proxy.limiter.base import Period
from proxy.limiter.core.periods import (
    PERIODS,
    civil_from_days,
    days_from_civil,
    index,
    span,
    start,
    until_reset,
)


@pytest.mark.parametrize(
    ("period", "before", "after"),
    [
        ("day", at(2026, 11, 25, 23, 59, 59), at(2026, 11, 26)),
        ("week", at(2026, 11, 29, 23, 59, 59), at(2026, 11, 30)),  # Sunday -> Monday
        ("month", at(2026, 12, 31, 23, 59, 59), at(2027, 1, 1)),  # Dec 31 -> Jan 1
        ("day", at(2026, 12, 31, 23, 59, 59), at(2027, 1, 1)),
        ("month", at(2028, 2, 29, 23, 59, 59), at(2028, 3, 1)),  # leap year
        ("month", at(2027, 2, 28, 23, 59, 59), at(2027, 3, 1)),  # not a leap year
        ("day", at(2028, 2, 28, 23, 59, 59), at(2028, 2, 29)),
        ("month", at(2100, 2, 28, 23, 59, 59), at(2100, 3, 1)),  # century: not leap
        ("month", at(2000, 2, 29, 23, 59, 59), at(2000, 3, 1)),  # 400 years: leap
    ],
)
def test_a_boundary_starts_the_next_period(period: Period, before: float, after: float) -> None:
    assert index(period, after) == index(period, before) + 1
    assert span(period, before).end == after
    assert span(period, after).start == after
    assert until_reset(period, before) == 1.0


def test_weeks_start_on_monday() -> None:
    monday = at(2026, 11, 23)
    assert dt.datetime.fromtimestamp(monday, dt.UTC).weekday() == 0
    assert span("week", at(2026, 11, 26, 12)).start == monday
    assert span("week", at(2026, 11, 29, 23)).end == at(2026, 11, 30)


def test_february_has_29_days_in_a_leap_year_only() -> None:
    assert span("month", at(2028, 2, 10)).end - span("month", at(2028, 2, 10)).start == 29 * 86400
    assert span("month", at(2027, 2, 10)).end - span("month", at(2027, 2, 10)).start == 28 * 86400


@given(st.integers(min_value=-719_162, max_value=2_000_000))
def test_civil_dates_round_trip_like_the_standard_library(days: int) -> None:
    date = dt.date(1970, 1, 1) + dt.timedelta(days=days)
    assert civil_from_days(days) == (date.year, date.month, date.day)
    assert days_from_civil(date.year, date.month, date.day) == days


@given(
    st.sampled_from(PERIODS),
    st.floats(min_value=0, max_value=at(2200, 1, 1), allow_nan=False),
)
def test_every_time_falls_in_its_span(period: Period, t: float) -> None:
    s = span(period, t)
    assert s.start <= t < s.end
    assert start(period, s.index + 1) == s.end
    when = dt.datetime.fromtimestamp(s.start, dt.UTC)
    assert (when.hour, when.minute, when.second) == (0, 0, 0)
    if period == "week":
        assert when.weekday() == 0
    if period == "month":
        assert when.day == 1
