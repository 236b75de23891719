"""Waiting for a condition in tests: bounded, never a fixed sleep standing in for it."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what or condition}")
        time.sleep(0.01)
