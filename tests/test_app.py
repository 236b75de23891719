"""The app's process-wide tuning, applied only where the CLI runs the proxy alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import gc
from proxy.process.app import GC_THRESHOLDS, tune_garbage_collector
before = gc.get_threshold()
tune_garbage_collector()
assert gc.get_threshold() == GC_THRESHOLDS != before, gc.get_threshold()
assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's view
"""


@pytest.mark.slow
def test_the_garbage_collector_is_tuned_in_a_process_of_its_own() -> None:
    # A subprocess: tuning is process-wide, and this test process must keep its defaults.
    subprocess.run([sys.executable, "-c", CHECK], check=True, timeout=60)
