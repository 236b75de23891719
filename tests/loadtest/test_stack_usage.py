"""`make stack` says how to use it: the client keys the replicas accept and the README's
headless Locust command, pointing at its balancer (the plan only; nothing is started)."""

from __future__ import annotations

import re
from pathlib import Path

from loadtest.stack import Stack
from proxy.config import load_settings

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
