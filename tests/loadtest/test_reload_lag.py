"""loadtest/reload_lag.py runs: a small config reloaded in process, figures reported."""

from __future__ import annotations

import asyncio

import pytest

from loadtest.reload_lag import _measure


@pytest.mark.slow
def test_reports_each_reload_and_its_worst_loop_lag() -> None:
    report = asyncio.run(_measure(keys=300, reloads=2))
    assert report["keys"] == 300
    phases = {
        "reload_s",
        "with_release_s",
        "worst_loop_lag_ms",
        "worst_lag_reading_and_swapping_ms",
        "worst_lag_retiring_and_freeing_ms",
        # this process's CPU time during the worst stall: its own threads, or the machine
        "cpu_during_worst_lag_ms",
        "worst_lag_with_this_process_on_cpu_ms",
    }
    assert [set(r) for r in report["reloads"]] == [phases] * 2
