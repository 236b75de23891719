"""`llm-proxy showcase` (`make showcase`): the same calls, naive and through the proxy; the
naive side meets the upstream's 429s, the proxy side none, and every call succeeds."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.showcase.report import Attempt, Call, Side, from_first_request, summarize, table
from proxy.showcase.scenario import Scenario, run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).parent.parent.parent


def needs_matplotlib() -> None:
    """The timeline needs matplotlib, a dev dependency: CI has it (it must not skip there)."""
    if importlib.util.find_spec("matplotlib") is None and not os.environ.get("CI"):
        pytest.skip("matplotlib is not installed (the [dev] extra installs it)")


def test_summary_counts_calls_errors_and_the_upstreams_429s() -> None:
    ok = Call([Attempt(0.0, 0.1, 429), Attempt(1.0, 3.0, 200)], end=3.0)
    failed = Call([Attempt(0.0, 0.1, 429)] * 3, error="RateLimitError", end=2.0)
    summary = summarize(Side("naive", [ok, failed], upstream_429s=4))
    assert (summary.calls, summary.succeeded, summary.client_errors) == (2, 1, 1)
    assert (summary.upstream_429s, summary.attempts, summary.time_to_finish) == (4, 5, 3.0)


def test_times_count_from_the_first_request_of_either_side() -> None:
    naive = Side("naive", [Call([Attempt(0.3, 0.4, 429)], error="RateLimitError", end=0.4)], 1)
    proxied = Side("proxy", [Call([Attempt(0.5, 2.5, 200, 0.2)], end=2.5)], 0)
    rebased = from_first_request([naive, proxied])
    assert rebased[0].calls[0].attempts == [Attempt(0.0, pytest.approx(0.1), 429)]
    assert rebased[1].calls[0].attempts == [Attempt(pytest.approx(0.2), 2.2, 200, 0.2)]
    assert [side.calls[0].end for side in rebased] == [pytest.approx(0.1), 2.2]
    assert [side.upstream_429s for side in rebased] == [1, 0]


def test_the_table_has_one_row_per_side_under_its_header() -> None:
    sides = [
        Side("naive", [Call([Attempt(0.0, 2.5, 200)], end=2.5)], upstream_429s=3),
        Side("through the proxy", [Call([Attempt(0.0, 4.0, 200, 1.5)], end=4.0)], 0),
    ]
    lines = table([summarize(side) for side in sides]).splitlines()
    assert lines[0].split() == ["succeeded", "client", "errors", "upstream", "429s", "HTTP",
                                "requests", "finished", "in"]  # fmt: skip
    assert lines[1].split() == ["naive", "1/1", "0", "3", "1", "2.5", "s"]
    assert lines[2].split() == ["through", "the", "proxy", "1/1", "0", "0", "1", "4.0", "s"]


def test_a_short_scenario_naive_meets_429s_the_proxy_none(tmp_path: Path) -> None:
    """6 concurrent calls at an upstream of 2 a second: more than it takes at once."""
    naive, proxied = asyncio.run(run(Scenario(calls=6, upstream_rps=2, latency=(0.2, 0.4))))
    assert naive.upstream_429s > 0
    assert any(a.status == 429 for call in naive.calls for a in call.attempts)
    assert proxied.upstream_429s == 0
    assert [call.error for call in proxied.calls] == [None] * 6
    assert all([a.status for a in call.attempts] == [200] for call in proxied.calls)
    assert any(a.waited > 0 for call in proxied.calls for a in call.attempts)  # paced
    needs_matplotlib()
    from proxy.showcase.chart import draw

    draw([naive, proxied], tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes().startswith(PNG_MAGIC)


def test_the_command_prints_its_table_and_writes_its_png_here(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "showcase", "--calls", "4", "--latency", "0.1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^(naive client.*|the same client.*)$", result.stdout, re.M)
    assert len(rows) == 2, result.stdout
    assert rows[1].split()[-6:] == ["4/4", "0", "0", "4", rows[1].split()[-2], "s"]
    needs_matplotlib()
    assert (tmp_path / "showcase.png").read_bytes().startswith(PNG_MAGIC)
    assert "timeline: showcase.png" in result.stdout


def test_make_showcase_installs_matplotlib_and_runs_it() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^showcase: (.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert target is not None
    assert "llm-proxy showcase" in target.group(2) or "-m proxy showcase" in target.group(2)
    assert re.search(r"pip install .*matplotlib", makefile)


def test_the_readme_shows_the_table_and_the_picture() -> None:
    readme = (ROOT / "README.md").read_text()
    side = Side("naive client, straight to the upstream", [], 0)
    header = table([summarize(side)]).splitlines()[0]
    assert header in readme
    assert re.search(r"^naive client, straight to the upstream +\d+/10 ", readme, re.M)
    assert re.search(r"^the same client, through the proxy +10/10 +0 +0 ", readme, re.M)
    assert "](docs/showcase.png)" in readme
    picture = (ROOT / "docs" / "showcase.png").read_bytes()
    assert picture.startswith(PNG_MAGIC) and len(picture) < 100_000  # small in the repo
