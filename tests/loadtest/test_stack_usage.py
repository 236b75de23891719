"""`make stack` says how to use it: the client keys the replicas accept, the README's
example.py and headless Locust command, pointing at its balancer (the plan; the example
runs against the stack's proxy config)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.proxy_server import ProxyInThread

from loadtest.stack import Stack
from proxy.config.settings import load_settings
from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread

ROOT = Path(__file__).resolve().parents[2]


def test_the_banner_names_the_keys_the_replicas_accept_and_the_readmes_command(
    tmp_path: Path,
) -> None:
    stack = Stack.from_compose(tmp_path / "stack", free_ports=True)
    usage = stack.usage()
    printed = re.search(r"client keys \(config/stack/proxy.yaml\): (.*)", usage)
    assert printed is not None, usage
    accepted = load_settings(ROOT / "config/stack/proxy.yaml", env={}).keys
    assert printed.group(1).split(", ") == [k.key.get_secret_value() for k in accepted if k.key]

    command = re.search(r"(\.venv/bin/locust .*)", usage)
    assert command is not None, usage
    readme = " ".join((ROOT / "README.md").read_text().split())
    as_documented = command.group(1).replace(stack.lb_url, "http://127.0.0.1:8080")
    as_documented = re.sub(r"--csv \S+", "--csv .stack/locust", as_documented)
    assert as_documented in readme


@pytest.mark.slow
def test_the_banners_example_py_command_works_against_the_stacks_proxy(
    tmp_path: Path, redis_url: str
) -> None:
    """example.py with OPENAI_BASE_URL and OPENAI_API_KEY as the banner prints them, at a
    proxy on config/stack/proxy.yaml (its upstreams and Redis: this test's)."""
    stack = Stack.from_compose(tmp_path / "stack", free_ports=True)
    command = re.search(r"(OPENAI_BASE_URL=\S+ OPENAI_API_KEY=\S+ \.venv/bin/python example\.py)",
                        stack.usage())  # fmt: skip
    assert command is not None, stack.usage()
    with (
        run_in_thread(FakeUpstreamConfig(port=0)) as one,
        run_in_thread(FakeUpstreamConfig(port=0)) as two,
    ):
        env = {"UPSTREAM_1_URL": one.url, "UPSTREAM_2_URL": two.url, "REDIS_URL": redis_url}
        settings = load_settings(ROOT / "config/stack/proxy.yaml", env=env)
        with ProxyInThread(settings) as proxy:
            line = command.group(1).replace(stack.lb_url, proxy.url)
            line = line.replace(".venv/bin/python", shlex.quote(sys.executable))
            environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
            result = subprocess.run(
                ["bash", "-c", line], cwd=ROOT, env=environment, capture_output=True,
                text=True, timeout=60,
            )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert len([line for line in result.stdout.splitlines() if line.strip()]) == 2
        served = one.stats()["served"] + two.stats()["served"]
        assert served == 2  # the example's two calls went through the stack's deployments
