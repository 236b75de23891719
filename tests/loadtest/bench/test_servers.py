"""The processes of a benchmark: a baseline revision's proxy imports that revision's code."""

from __future__ import annotations

import os
import subprocess
import sys

from loadtest.bench.servers import checkout, source_env
from loadtest.topology import REPO


def test_the_work_trees_proxy_runs_with_the_environment_as_it_is() -> None:
    assert source_env(REPO) == dict(os.environ)


def test_a_baseline_checkout_is_what_its_proxy_imports() -> None:
    with checkout("HEAD") as source:
        assert (source / "proxy" / "__init__.py").is_file()
        done = subprocess.run(
            [sys.executable, "-c", "import proxy; print(proxy.__file__)"],
            cwd=source,
            env=source_env(source),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().startswith(str(source))
    assert not source.exists()  # removed afterwards
