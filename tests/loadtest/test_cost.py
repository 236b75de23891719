"""loadtest/cost.py measures the pipeline it means to: every request answered 200."""

from __future__ import annotations

import pytest

from loadtest import cost


@pytest.mark.parametrize("mode", cost.MODES)
async def test_the_measured_requests_are_served(mode: str) -> None:
    assert await cost._requests(mode, count=3, warmup=2) > 0
