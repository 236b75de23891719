"""Waiting for a condition in tests: bounded, never a fixed sleep standing in for it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx


def wait_until(condition: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what or condition}")
        time.sleep(0.01)


def wait_ready(url: str, process: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Return once ``url`` answers 200; fail the test if ``process`` (the server behind
    it) exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the demo exited"
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the demo did not become ready")
