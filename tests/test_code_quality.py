"""The code stays as clean as it is: ruff (lint and format) and mypy --strict pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


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


def test_no_function_of_the_package_is_over_the_complexity_ceiling() -> None:
    from radon.complexity import cc_visit

    over = [
        f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname} ({block.complexity})"
        for path in sorted((ROOT / "proxy").rglob("*.py"))
        for block in cc_visit(path.read_text())
        if block.complexity > MAX_COMPLEXITY
    ]
    assert not over, "\n".join(over)
