"""Spend records: summed per owner and day, spread over days, weeks and months, reported
as JSON rows and CSV."""

from __future__ import annotations

import csv
import io

from support.limits import at

from proxy.limiter.core import periods
from proxy.money.spend import (
    Held,
    Owner,
    Spend,
    Tally,
    correction,
    days_of,
    field_name,
    parse_field,
    report,
    summed,
    to_csv,
)

ALICE = Owner("alice", "research", "gpt-4o")
BOB = Owner("bob", "", "gpt-4o")


def test_a_field_name_round_trips() -> None:
    assert parse_field(field_name("usd", ALICE)) == ("usd", ALICE)
    assert parse_field("something else") is None


def test_spend_is_counted_in_the_day_week_and_month_it_started_in() -> None:
    tally = Tally()
    tally.add(ALICE, Spend(0.5, 100, 10), at(2026, 11, 30, 23, 59))  # a Monday, month's end
    tally.add(ALICE, Spend(0.25, 50, 5), at(2026, 12, 1, 0, 1))
    totals = tally.totals()
    usd = field_name("usd", ALICE)
    november = ("month", periods.index("month", at(2026, 11, 30)))
    december = ("month", periods.index("month", at(2026, 12, 1)))
    week = ("week", periods.index("week", at(2026, 12, 1)))
    assert totals[november][usd] == 0.5
    assert totals[december][usd] == 0.25
    assert totals[week][usd] == 0.75  # Monday and Tuesday: one week
    assert totals[week][field_name("requests", ALICE)] == 2


def test_what_could_not_be_written_is_put_back_and_summed() -> None:
    tally = Tally()
    tally.add(BOB, Spend(1.0, 1, 1), at(2026, 11, 25))
    taken = tally.take()
    assert tally.days == {}
    tally.add(BOB, Spend(2.0, 1, 1), at(2026, 11, 25))
    tally.merge(taken)
    day = ("day", periods.index("day", at(2026, 11, 25)))
    assert tally.totals()[day][field_name("usd", BOB)] == 3.0


def test_the_report_has_this_period_and_the_last_per_owner_and_as_csv() -> None:
    now = at(2026, 11, 25, 12)
    current = {field_name("usd", ALICE): 1.5, field_name("requests", ALICE): 3.0}
    current |= {field_name("usd", BOB): 0.25, field_name("output_tokens", BOB): 40.0}
    previous = {field_name("usd", BOB): 9.0}
    document = report("month", now, current, previous)
    assert document["current"]["start"] == "2026-11-01T00:00:00Z"
    assert document["current"]["end"] == "2026-12-01T00:00:00Z"
    assert document["previous"]["start"] == "2026-10-01T00:00:00Z"
    assert document["current"]["total_usd"] == 1.75
    assert [r["key"] for r in document["current"]["spend"]] == ["alice", "bob"]
    assert document["current"]["spend"][0] == {
        "key": "alice",
        "team": "research",
        "model": "gpt-4o",
        "usd": 1.5,
        "input_tokens": 0,
        "output_tokens": 0,
        "requests": 3,
        "estimated": 0,
    }
    rows = list(csv.DictReader(io.StringIO(to_csv(document))))
    assert [(r["period_start"][:7], r["key"], r["usd"]) for r in rows] == [
        ("2026-10", "bob", "9.0"),
        ("2026-11", "alice", "1.5"),
        ("2026-11", "bob", "0.25"),
    ]


def test_a_name_a_spreadsheet_would_run_is_quoted_as_text() -> None:
    owner = Owner("=HYPERLINK(1)", "", "m")
    document = report("day", at(2026, 11, 25), {field_name("usd", owner): 1.0}, {})
    [row] = list(csv.DictReader(io.StringIO(to_csv(document))))
    assert row["key"] == "'=HYPERLINK(1)"


def test_an_estimate_is_counted_and_its_correction_leaves_the_real_spend() -> None:
    tally = Tally()
    day = at(2026, 11, 25, 9)
    estimate = Spend(0.5, 400, 256, estimated=1)
    tally.add(ALICE, estimate, day)
    tally.add(ALICE, correction(estimate, Spend(0.1, 100, 20)), day)
    totals = tally.totals()[("month", periods.index("month", day))]
    [row] = report("month", day, totals, {})["current"]["spend"]
    assert (row["usd"], row["input_tokens"], row["output_tokens"]) == (0.1, 100, 20)
    assert (row["requests"], row["estimated"]) == (1, 0)
    rows = list(csv.DictReader(io.StringIO(to_csv(report("month", day, totals, {})))))
    assert rows[0]["estimated"] == "0"


def test_a_held_estimate_round_trips_and_nothing_else_is_read_as_one() -> None:
    held = Held(ALICE, at(2026, 11, 25), "d", Spend(0.5, 400, 256, estimated=1), {"usd": 0.5})
    assert Held.decode(held.encode()) == held
    assert Held.decode(held.encode().decode()) == held
    for junk in (b"-", b"[]", b'["a", "b"]', b'{"x": 1}', held.encode().replace(b'"d"', b"1")):
        assert Held.decode(junk) is None


def test_the_report_shows_the_current_periods_days_summed_when_asked() -> None:
    """``?by_day=true``: each day of the period up to today, its sums (no rows)."""
    now = at(2026, 12, 3, 12)  # a Thursday: the week began on Monday, Nov 30
    days = days_of("week", now)
    assert [periods.start("day", d) for d in days] == [
        at(2026, 11, 30),
        at(2026, 12, 1),
        at(2026, 12, 2),
        at(2026, 12, 3),
    ]
    stored = [
        {},
        {field_name("usd", ALICE): 1.5, field_name("requests", ALICE): 2.0},
        {field_name("usd", BOB): 0.5, field_name("requests", BOB): 1.0}
        | {field_name("estimated", BOB): 1.0, field_name("usd", ALICE): 0.25},
        {},
    ]
    document = report("week", now, {}, {}, stored)
    assert [d["date"] for d in document["current"]["days"]] == [
        "2026-11-30",
        "2026-12-01",
        "2026-12-02",
        "2026-12-03",
    ]
    second, third = document["current"]["days"][1:3]
    assert second == {
        "date": "2026-12-01",
        "start": "2026-12-01T00:00:00Z",
        "end": "2026-12-02T00:00:00Z",
        "usd": 1.5,
        "input_tokens": 0,
        "output_tokens": 0,
        "requests": 2,
        "estimated": 0,
    }
    assert (third["usd"], third["requests"], third["estimated"]) == (0.75, 1, 1)
    assert "days" not in report("week", now, {}, {})["current"]
    assert list(days_of("month", at(2026, 12, 1, 0, 1))) == [periods.index("day", at(2026, 12, 1))]
    assert summed([]) == {
        "usd": 0.0,
        "input_tokens": 0,
        "output_tokens": 0,
        "requests": 0,
        "estimated": 0,
    }
