"""The real Claude Code CLI through the demo's own config (config/demo.yaml) in a real
proxy process, in front of the demo's fake upstream: only ``ANTHROPIC_BASE_URL`` and a
client key, no ``ANTHROPIC_MODEL``. Its own model names (``claude-opus-4-8``, a Haiku...)
are served by the demo's ``claude-*`` pattern group and go upstream as asked.

Skipped when ``claude`` is not on PATH (``npm install -g @anthropic-ai/claude-code``;
.ci/run installs it when npm is there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.proxy_server import ProxyProcess

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.process.demo import DEMO_CLAUDE, DEMO_KEY, upstream_options

ROOT = Path(__file__).parent.parent.parent
CLAUDE = shutil.which("claude")

pytestmark = pytest.mark.skipif(
    CLAUDE is None,
    reason="the Claude Code CLI is not installed (npm install -g @anthropic-ai/claude-code)",
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    """The demo's fake upstream (its strict limit and latency), on a free port."""
    with run_in_thread(FakeUpstreamConfig(port=0, **upstream_options())) as handle:
        yield handle


def _claude_env(home: Path, proxy: ProxyProcess) -> dict[str, str]:
    """Nothing of this machine's Claude Code set-up: a fresh home, no ANTHROPIC_* but the
    base URL and the demo's client key (no model named), no traffic but the proxy's."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    return {
        **env,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy.url,
        "ANTHROPIC_API_KEY": DEMO_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def test_claude_code_says_hi_through_the_demo_config(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    config: dict[str, Any] = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    env = {"FAKE_UPSTREAM_URL": upstream.url, "REDIS_URL": ""}  # the in-memory limiter
    home = tmp_path / "home"
    home.mkdir()
    with ProxyProcess(config, tmp_path, env=env) as proxy:
        assert CLAUDE is not None
        result = subprocess.run(
            [CLAUDE, "-p", "say hi"],
            env=_claude_env(home, proxy),
            cwd=home,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.strip()  # the fake upstream's answer, printed
    lines = [json.loads(line) for line in proxy.logs().splitlines() if '"request_id"' in line]
    messages = [line for line in lines if line.get("api", "").startswith("messages")]
    assert messages, lines
    for line in messages:  # served by the pattern group, each under the name it asked for
        assert (line["status"], line["model"]) == (200, DEMO_CLAUDE), line
        assert line["requested_model"].startswith("claude-"), line
    assert upstream.stats()["last_request"]["model"].startswith("claude-")  # as asked
