"""loadtest/noise.py: two identical proxies' rounds read as the peer comparison reads them."""

from __future__ import annotations

import pytest

from loadtest.bench.model import Round, Turn
from loadtest.noise import spread


def _round(rps_a: float, rps_b: float, added_a: float | None, added_b: float | None) -> Round:
    return Round(Turn(rps_a, 300.0, 0.8, added_a), Turn(rps_b, 300.0, 0.8, added_b))


def test_each_round_is_b_over_a_and_b_less_a() -> None:
    s = spread([_round(4000, 3000, 0.5, 0.75), _round(3000, 3600, 0.9, 0.6)])
    assert s.ratios == [0.75, 1.2]
    assert s.added_ms == pytest.approx([0.25, -0.3])
    first, second = s.lines()
    assert "0.75x, 1.20x" in first and "range 0.75x to 1.20x" in first
    assert "+0.25, -0.30 ms" in second and "range -0.30 to +0.25 ms" in second


def test_a_measure_a_round_lacks_is_left_out_of_that_measure_only() -> None:
    s = spread(
        [_round(0, 3000, 0.5, 0.6), _round(3000, 3000, None, 0.6), _round(2000, 3000, 0.5, 0.5)]
    )
    assert s.ratios == [1.0, 1.5]
    assert s.added_ms == pytest.approx([0.1, 0.0])
    with pytest.raises(ValueError, match="no round"):
        spread([_round(0, 3000, None, 0.6)])
