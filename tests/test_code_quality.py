"""The code stays as clean as it is: ruff (lint and format) and mypy --strict pass; the
Makefile's serial run collects every file that holds a serial test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_passes(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


# Functions that orchestrate stay small; nothing in the package is over this (radon's
# cyclomatic complexity, which counts boolean operators as ruff's mccabe does not).
MAX_COMPLEXITY = 15


@pytest.mark.slow
def test_no_function_of_the_package_is_over_the_complexity_ceiling() -> None:
    from radon.complexity import cc_visit

    over = [
        f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname} ({block.complexity})"
        for path in sorted((ROOT / "proxy").rglob("*.py"))
        for block in cc_visit(path.read_text())
        if block.complexity > MAX_COMPLEXITY
    ]
    assert not over, "\n".join(over)


# A test or a module marked serial: a decorator, or an entry of a module's pytestmark.
SERIAL_MARK = re.compile(r"^\s*@?pytest\.mark\.serial\b", re.M)


def test_every_file_with_a_serial_test_is_in_the_makefiles_serial_run() -> None:
    """``make test`` runs the tests marked serial from the files SERIAL_TESTS names (not
    from the whole suite, which it would have to collect again): a serial test in any
    other file would never run."""
    listed = re.search(r"^SERIAL_TESTS\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert listed is not None, "the Makefile names no SERIAL_TESTS"
    holding = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if SERIAL_MARK.search(path.read_text())
    }
    assert holding <= set(listed.group(1).split()), holding - set(listed.group(1).split())
