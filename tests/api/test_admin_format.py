"""How the admin pages write numbers and times (pure): one format everywhere."""

from __future__ import annotations

import math

from proxy.api.admin_format import count, dollars, duration, number, per, rate, unit, utc


def test_whole_things_are_floored_and_separated() -> None:
    assert count(112.99) == "112"  # 0.99 of a request is not one
    assert count(1.99) == "1"
    assert count(1000) == "1,000"
    assert count(0.9999999999) == "1"  # a float's noise is not a missing request
    assert count(-0.5) == "-1"
    assert count(math.inf) == "unlimited"


def test_other_figures_keep_two_decimals_at_most() -> None:
    assert number(56.571428) == "56.57"
    assert number(1000.0) == "1,000"
    assert number(1234.5) == "1,234.5"
    assert number(0.001) == "0"
    assert rate(94285.714) == "94,286"
    assert rate(5.657) == "5.66"


def test_dollars_have_cents_or_the_digits_a_small_amount_needs() -> None:
    assert dollars(1234.5) == "$1,234.50"
    assert dollars(0) == "$0.00"
    assert dollars(0.5) == "$0.50"
    assert dollars(0.0042) == "$0.0042"
    assert dollars(0.00036) == "$0.00036"


def test_times_are_seconds_minutes_hours_or_days() -> None:
    assert duration(0.504) == "0.5 s"
    assert duration(0.01) == "0.1 s"
    assert duration(42.4) == "42 s"
    assert duration(120) == "2 min"
    assert duration(90) == "1.5 min"
    assert duration(3 * 3600 + 1800) == "3.5 h"
    assert duration(24 * 86400) == "24 d"


def test_windows_say_what_they_count_and_per_what() -> None:
    assert per(60) == "per minute"
    assert per(86400) == "per day"
    assert per(10) == "per 10 s"
    assert per(30 * 86400) == "per 30 d"
    assert unit("requests", 1) == "request"
    assert unit("input_tokens", 1000) == "input tokens"
    assert utc({"in": 1.0, "at": "2026-12-08T00:00:00.000Z"}) == "2026-12-08 00:00 UTC"
