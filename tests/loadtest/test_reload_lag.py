"""loadtest/reload_lag.py runs: a small config reloaded in process, figures reported."""

from __future__ import annotations

import asyncio

from loadtest.reload_lag import _measure


def test_reports_each_reload_and_its_worst_loop_lag() -> None:
    report = asyncio.run(_measure(keys=300, reloads=2))
    assert report["keys"] == 300
    assert [sorted(r) for r in report["reloads"]] == [["reload_s", "worst_loop_lag_ms"]] * 2
