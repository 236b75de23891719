"""OpenAI's rate-limit header durations, both ways."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.shapes.ratelimit_headers import format_reset, parse_number, parse_reset


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.12, "120ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3725, "1h2m5s")],
)
def test_format(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("20ms", 0.02), ("1.5s", 1.5), ("2", 2.0), ("1h2m3s", 3723.0)],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_reset(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "soon", "5x"])
def test_unreadable_values_are_none(text: str | None) -> None:
    assert parse_reset(text) is None


@pytest.mark.parametrize(
    "text",
    ["inf", "-inf", "Infinity", "nan", "NaN", "1e999", "1_000", "0x10", "1 000", "99" * 200 + "h"],
)
def test_non_finite_or_loosely_written_numbers_are_unreadable(text: str) -> None:
    """What float() would take beyond a plain decimal (or a duration that overflows)
    is no number an upstream means."""
    assert parse_reset(text) is None
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("text", "number"), [("12", 12.0), (" 0.5 ", 0.5), ("-1", -1.0), ("1e12", 1e12), (".5", 0.5)]
)
def test_plain_decimals_and_exponents_are_numbers(text: str, number: float) -> None:
    assert parse_number(text) == number


def test_a_reset_is_never_negative() -> None:
    assert parse_reset("-5") == 0.0


@given(st.floats(min_value=0.001, max_value=100_000))
def test_round_trip_never_undershoots(seconds: float) -> None:
    parsed = parse_reset(format_reset(seconds))
    assert parsed is not None
    assert parsed >= seconds - 0.001
