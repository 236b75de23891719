"""The README's shell commands run as pasted, against what the README starts.

Every command of its ``sh`` / ``bash`` blocks is either run here, against the demo or
the servers this module starts on free ports (only the ports of the pasted text
rewritten, and ``.venv/bin/`` to this interpreter), or skipped with its reason in
``SKIPPED``; a command that is neither fails ``test_every_command_is_run_or_skipped``.
Every Python block (the SDK examples, indented in a list or not) runs against the demo
too; the first, as ``example.py``, also in test_cli.py; the demo's printed commands in
test_demo.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.ports import free_port
from support.waiting import wait_ready, wait_until

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
PYTHON = shlex.quote(sys.executable)

# Each command's beginning -> why it is not run here.
SKIPPED = {
    "make test": "the whole suite, this module included",
    "make showcase": "installs matplotlib into .venv, then 10-15 s: tests/showcase runs it",
    "make lint": "ruff and mypy over the repository: CI runs them",
    "make stack": "long-running processes (Redis, replicas, a balancer): tests/loadtest",
    "make bench": "15 minutes of wrk: its report and chart are tested in tests/loadtest/bench",
    ".venv/bin/locust": "needs `make stack`: tests/loadtest/test_locustfile.py runs Locust",
    "export ANTHROPIC_": "Claude Code's settings: tests/api/test_claude_code.py sets them",
    "claude": "Claude Code (a TTY): tests/api/test_claude_code.py runs `claude -p` so",
}
# Each command's beginning -> the test that runs it (``make demo``: what it runs, the
# `demo` fixture's `llm-proxy serve`).
RUN = {
    "make demo": "demo",
    "A=": "test_the_admin_key_commands_run_against_the_demo",
    "curl ": "test_the_admin_key_commands_run_against_the_demo",
    ".venv/bin/llm-proxy fake-upstream --port 8001": "test_the_demo_from_its_file_starts_quietly",
    ".venv/bin/llm-proxy serve --config config/demo.yaml": (
        "test_the_demo_from_its_file_starts_quietly"
    ),
    ".venv/bin/llm-proxy check-config": "test_check_config_names_the_unset_variables",
    ".venv/bin/llm-proxy fake-upstream --port 8002": "test_the_fake_upstream_command_serves",
}


def _blocks() -> list[str]:
    return re.findall(r"^```(?:sh|bash)\n(.*?)^```", README, re.S | re.M)


def _commands(block: str) -> list[str]:
    """The block's commands: comment lines dropped, a command continued over lines
    (``\\``, or a quote still open) joined."""
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if not line.endswith("\\") and _whole(pending):
            commands.append(pending.strip())
            pending = ""
    assert not pending, pending
    return commands


def _whole(text: str) -> bool:
    """Whether ``text`` is a whole shell command (no quote left open)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def _block_with(text: str) -> str:
    (block,) = [b for b in _blocks() if text in b]
    return block


def test_every_command_is_run_or_skipped() -> None:
    commands = [command for block in _blocks() for command in _commands(block)]
    assert len(commands) >= 15
    unhandled = [c for c in commands if not any(c.startswith(p) for p in (*RUN, *SKIPPED))]
    assert unhandled == []
    for test in set(RUN.values()) - {"demo"}:
        assert test in globals(), test


def _pasted(command: str, ports: dict[int, int]) -> str:
    """``command`` as this test runs it: the README's ports rewritten, this interpreter
    for .venv's."""
    for documented, port in ports.items():
        command = re.sub(rf"(?<=[:\s]){documented}\b", str(port), command)
    # One pass: this interpreter's own path may hold ".venv/bin/python" (CI's does).
    venv = {".venv/bin/llm-proxy": f"{PYTHON} -m proxy", ".venv/bin/python": PYTHON}
    return re.sub(r"\.venv/bin/(?:llm-proxy|python)", lambda m: venv[m[0]], command)


def _start(script: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", script],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # the group, background jobs included, stopped at once
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=15)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`make demo` (`llm-proxy serve`, the embedded demo) on free ports: its port."""
    port, upstream_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    process = _start(
        f"exec {PYTHON} -m proxy serve",
        log,
        {"LLM_PROXY_PORT": str(port), "LLM_PROXY_DEMO_UPSTREAM_PORT": str(upstream_port)},
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/health/ready", process)
        yield port
    finally:
        _stop(process)


def _run_curls(block: str, port: int) -> tuple[list[int], str]:
    """The block's commands run against the demo on ``port``: each curl's status, checked
    against the status its comment documents (200 otherwise), and what they printed."""
    commands = _commands(block)
    documented = []
    for command in commands:
        if command.startswith("curl "):
            # Its comment, or the comment line after it: "# 204", "# 201 {...}".
            after = block[block.index(command) + len(command) :].split("\n")
            comments = command.splitlines()[-1] + after[0]
            comments += after[1] if after[1].lstrip().startswith("#") else ""
            status = re.search(r"#\s*(\d{3})\b", comments)
            documented.append(int(status.group(1)) if status else 200)
    # Each curl also writes its status (the only change to the pasted text but the port).
    script = _pasted(block, {8000: port}).replace(
        "curl -s ", "curl -s --write-out '\\n[status %{http_code}]\\n' "
    )
    done = subprocess.run(
        ["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    statuses = [int(s) for s in re.findall(r"^\[status (\d{3})\]$", done.stdout, re.M)]
    assert statuses == documented, done.stdout
    return documented, done.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_admin_key_commands_run_against_the_demo(demo: int) -> None:
    """Each curl gets the status its comment documents (200 otherwise): the key is
    created (its secret shown once), listed, changed, rotated and revoked."""
    documented, printed = _run_curls(_block_with("/admin/keys"), demo)
    assert documented[0] == 201 and documented[-1] == 204
    assert printed.count('"key":"sk-llmp-') == 2, printed  # created, then rotated


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_admin_team_commands_run_against_the_demo(demo: int) -> None:
    """The team is created, listed, changed and deleted, as documented."""
    documented, printed = _run_curls(_block_with("/admin/teams"), demo)
    assert documented == [201, 200, 200, 204]
    assert printed.count('"name":"platform"') == 3, printed  # created, listed, changed


def _python_blocks() -> list[str]:
    """The README's ``python`` blocks, an indented one (in a list item) dedented."""
    blocks = re.finditer(r"^( *)```python\n(.*?)^\1```", README, re.S | re.M)
    return [textwrap.dedent(block.group(2)) for block in blocks]


def test_every_python_block_runs_against_the_demo(demo: int) -> None:
    """The SDK examples (OpenAI's chat and Responses, Anthropic's Messages) as pasted,
    but for the demo's port: each exits 0 and prints what the demo's upstream answered.
    (Their 7 requests fit in the demo key's 10 a minute.)"""
    blocks = _python_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        assert "127.0.0.1:8000" in block, block
        done = subprocess.run(
            [sys.executable, "-c", _pasted(block, {8000: demo})],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 0, block + done.stderr
        assert done.stdout.strip(), block


@pytest.mark.slow
def test_the_demo_from_its_file_starts_quietly(tmp_path: Path) -> None:
    """The fake upstream in the background, then `serve` from config/demo.yaml, pasted
    as one: the proxy serves through it, and start-up says nothing of an upstream that
    does not answer (it had not bound its port yet: start-up gives it a moment)."""
    upstream_line, serve_line = [
        c for c in _commands(_block_with("llm-proxy check-config")) if "--port 800" in c
    ][:2]
    assert shlex.split(upstream_line, comments=True)[-1] == "&"  # in the background
    assert "--port 8001" in upstream_line
    assert "serve --config config/demo.yaml" in serve_line
    port, upstream_port = free_port(), free_port()
    script = _pasted(f"{upstream_line}\n{serve_line}", {8000: port, 8001: upstream_port})
    log = tmp_path / "serve.log"
    # config/demo.yaml's upstream is ${FAKE_UPSTREAM_URL:-http://127.0.0.1:8001}.
    env = {"FAKE_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}"}
    process = _start(script, log, env)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health/ready", process)
        chat = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": "Bearer demo-key"},
            timeout=30,
        )
        assert chat.status_code == 200, chat.text
    finally:
        _stop(process)
    printed = log.read_text()
    assert "does not answer" not in printed, printed


@pytest.mark.slow
def test_check_config_names_the_unset_variables() -> None:
    """As the README says: every unset ${VAR} of config/example.yaml at once, exit 1."""
    (command,) = [c for b in _blocks() for c in _commands(b) if "check-config" in c]
    assert "exit 1" in _block_with(command)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_KEY", "_URL"))}
    done = subprocess.run(
        ["bash", "-c", _pasted(command, {})],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    unset = re.findall(r"environment variable (\w+) is not set", done.stdout + done.stderr)
    assert len(unset) >= 2, done.stdout + done.stderr


@pytest.mark.slow
def test_the_fake_upstream_command_serves(tmp_path: Path) -> None:
    (command,) = [c for b in _blocks() for c in _commands(b) if "--port 8002" in c]
    port = free_port()
    process = _start(_pasted(command, {8002: port}), tmp_path / "upstream.log")
    try:

        def answers() -> bool:
            assert process.poll() is None, (tmp_path / "upstream.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/stats", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, timeout=30, what="the fake upstream")
    finally:
        _stop(process)
