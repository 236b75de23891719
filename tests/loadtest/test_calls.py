"""loadtest/calls.py counts what one more request costs a real worker, by function."""

from __future__ import annotations

import pytest

from loadtest import calls
from loadtest.topology import REPO


@pytest.mark.slow
def test_each_request_runs_the_pipeline_once_and_start_up_cancels_out() -> None:
    counted = calls.calls_per_request(REPO, "nolimits", runs=(10, 30))
    assert counted["proxy/pipeline/pipeline.py:handle"] >= 1.0  # a coroutine: once per resumption
    assert counted["proxy/pipeline/pipeline.py:_finish"] == 1.0
    assert "proxy/process/app.py:create_app" not in counted  # start-up: in both runs, subtracted
