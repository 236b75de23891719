"""OpenAI's rate-limit header durations, both ways."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.ratelimit_headers import format_reset, parse_reset


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


@given(st.floats(min_value=0.001, max_value=100_000))
def test_round_trip_never_undershoots(seconds: float) -> None:
    parsed = parse_reset(format_reset(seconds))
    assert parsed is not None
    assert parsed >= seconds - 0.001
