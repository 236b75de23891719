"""The embedded demo (`make demo`, `llm-proxy serve` without --config) shows a rate limiter:
the commands it prints show pacing, a key's 429 and the admin page, as they say."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.proxy_server import free_port
from support.waiting import wait_ready

from proxy.config.settings import load_settings
from proxy.fake_upstream import FakeUpstreamConfig
from proxy.fake_upstream.cli import build_parser, config_from_args
from proxy.process.demo import (
    BURST,
    DEMO_ADMIN_KEY,
    DEMO_KEY_RPM,
    EXAMPLE_REQUESTS,
    LEFT_FOR_THE_LIMIT,
    OVER_THE_KEY,
    demo_settings,
    instructions,
    tries,
    upstream_options,
)

ROOT = Path(__file__).parent.parent


def test_config_demo_yaml_is_the_embedded_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file and the code are the same demo, fake upstream command included."""
    monkeypatch.setenv("FAKE_UPSTREAM_URL", "http://127.0.0.1:8001")
    monkeypatch.delenv("REDIS_URL", raising=False)
    path = ROOT / "config" / "demo.yaml"
    assert load_settings(path) == demo_settings("http://127.0.0.1:8001")
    command = re.search(r"#\s+llm-proxy fake-upstream (.*?) &\n", path.read_text())
    assert command is not None
    from_file = config_from_args(build_parser().parse_args(shlex.split(command.group(1))))
    assert from_file == FakeUpstreamConfig(port=8001, **upstream_options())
    readme = (ROOT / "README.md").read_text()
    assert f"llm-proxy fake-upstream {command.group(1)} &" in readme


def test_the_instructions_name_the_keys_and_every_command() -> None:
    text = instructions("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert "demo-key" in text and f"password: {DEMO_ADMIN_KEY}" in text
    for attempt in tries("http://127.0.0.1:8000"):
        assert _indented(attempt.command) in text
    # On the default port, the README's command as it is.
    assert "\n   .venv/bin/python example.py\n" in text


def test_the_key_limit_step_says_what_the_steps_before_it_left() -> None:
    """The key's limit is one budget for every step: the text says what the SDK's call
    and the burst took of it, so 200s before the 429s are what it said to expect."""
    assert (ROOT / "example.py").read_text().count(".create(") == EXAMPLE_REQUESTS
    assert LEFT_FOR_THE_LIMIT == DEMO_KEY_RPM - EXAMPLE_REQUESTS - BURST > 0
    step = " ".join(tries("http://127.0.0.1:8000")[2].what.split())
    assert f"its {DEMO_KEY_RPM} a minute" in step and "shared with the steps above" in step
    assert f"({EXAMPLE_REQUESTS + BURST} requests)" in step
    assert f"about {LEFT_FOR_THE_LIMIT} get 200 (more if you waited)" in step


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[str, str]]:
    """`llm-proxy serve` as `make demo` runs it, on free ports: (its URL, what it printed)."""
    port, upstream_port = free_port(), free_port()
    env = {**os.environ, "LLM_PROXY_DEMO_UPSTREAM_PORT": str(upstream_port)}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        printed = _read_instructions(process)
        wait_ready(f"{url}/health/ready", process)
        yield url, printed
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)


needs_curl = pytest.mark.skipif(
    shutil.which("curl") is None and not os.environ.get("CI"),
    reason="curl is not installed (.ci/run installs it)",
)


@pytest.mark.slow
def test_the_printed_sdk_command_runs_example_py(demo: tuple[str, str]) -> None:
    """`.venv/bin/python example.py` as printed (this interpreter for .venv's), with the
    demo key as example.py's default: no OPENAI_API_KEY set."""
    url, printed = demo
    command = tries(url)[0].command
    assert _indented(command) in printed
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    result = subprocess.run(
        ["bash", "-c", command.replace(".venv/bin/python", shlex.quote(sys.executable))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if line.strip()]) == 2


@pytest.mark.slow
@needs_curl
def test_the_printed_burst_is_paced_not_refused(demo: tuple[str, str]) -> None:
    url, printed = demo
    out = _run_printed(printed, tries(url)[1].command)
    statuses = re.findall(r"^HTTP/1.1 (\d+)", out, re.M)
    assert statuses == ["200"] * BURST, out
    waits = [float(ms) for ms in re.findall(r"^x-llm-proxy-queue-ms: ([\d.]+)", out, re.M | re.I)]
    assert waits and max(waits) > 0, out  # some waited for their turn instead of failing
    stats = httpx.get(_upstream_url(printed) + "/stats").json()
    assert stats["rejected"] == 0  # the upstream never saw more than its limit


@pytest.mark.slow
@needs_curl
def test_the_printed_key_limit_answers_429_with_retry_after(demo: tuple[str, str]) -> None:
    url, printed = demo
    out = _run_printed(printed, tries(url)[2].command)
    statuses = re.findall(r"^HTTP/1.1 (\d+)", out, re.M)
    assert len(statuses) == OVER_THE_KEY and statuses.count("429") >= OVER_THE_KEY - DEMO_KEY_RPM
    assert set(statuses) == {"200", "429"}, out
    # The steps before took their share: what is left (and refilled since) gets through.
    assert statuses.count("200") >= LEFT_FOR_THE_LIMIT, out
    assert len(re.findall(r"^retry-after: [1-9]", out, re.M | re.I)) == statuses.count("429")
    assert len(re.findall(r"^x-ratelimit-remaining-requests: \d", out, re.M | re.I)) == len(
        statuses
    )


@needs_curl
def test_the_printed_admin_page_opens_with_the_printed_credentials(
    demo: tuple[str, str],
) -> None:
    url, printed = demo
    page_url, state_command = tries(url)[3].command.splitlines()
    page = httpx.get(page_url, auth=("anyone", DEMO_ADMIN_KEY))
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert httpx.get(page_url).status_code == 401
    state = _run_printed(printed, state_command)
    assert '"gpt-4o-mini"' in state and '"fake-openai"' in state


def _indented(command: str) -> str:
    return "\n".join(f"   {line}" for line in command.splitlines())


def _run_printed(printed: str, command: str) -> str:
    assert _indented(command) in printed  # what the user reads is what runs
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def _upstream_url(printed: str) -> str:
    found = re.search(r"fake OpenAI and Anthropic upstream \((http://[^)]+)\)", printed)
    assert found is not None, printed
    return found.group(1)


def _read_instructions(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:  # the demo prints them before it serves
        lines.append(line)
        if line.startswith("   ANTHROPIC_BASE_URL=http") and "claude -p" in line:
            return "".join(lines)  # the last thing to try
    raise AssertionError(f"the demo exited after printing {''.join(lines)!r}")
