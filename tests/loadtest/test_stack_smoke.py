"""`loadtest.stack` brings the compose topology up on loopback, a short bounded headless
Locust run through its balancer completes and writes its CSV, the upstreams see no 429,
and everything stops."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import httpx
import pytest

from loadtest.stack import LocustRun, Stack, run_locust

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("locust") is None, reason="locust is not installed (dev extra)"
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is needed"),
]

HELLO = {"role": "user", "content": "hi"}
RPM = 600  # per upstream: 10 req/s each, light enough for a busy 2-core machine


@pytest.mark.slow
def test_stack_up_and_a_short_locust_run(tmp_path: Path) -> None:
    stack = Stack.from_compose(
        tmp_path / "stack",
        free_ports=True,
        # Prometheus and the web-UI Locust add start-up time, not coverage.
        skip={"prometheus", "locust-master", "locust-worker"},
        env={"STACK_RPM": str(RPM), "STACK_LATENCY": "0.01", "PROXY_WORKERS": "1"},
    )
    run = LocustRun(
        users=10,
        user_rate=3.0,  # 30 req/s offered for a combined limit of 20 req/s
        window=6.0,
        warmup=2.0,
        workers=1,
        csv_prefix=tmp_path / "locust",
    )
    with stack:
        assert {s.name for s in stack.of_kind("proxy")} == {"proxy-1", "proxy-2"}
        # A streamed request through the balancer reaches an upstream and ends with [DONE].
        response = httpx.post(
            f"{stack.lb_url}/v1/chat/completions",
            json={"model": "gpt-4o-mini", "stream": True, "messages": [HELLO]},
            headers={"authorization": "Bearer sk-stack-team-a"},
            timeout=10,
        )
        assert response.status_code == 200
        assert response.content.rstrip().endswith(b"data: [DONE]")
        report = run_locust(stack, run, log=lambda line: None)
        processes = list(stack.processes)
    assert all(p.popen.poll() is not None for p in processes), "a process outlived the stack"

    assert (tmp_path / "locust_stats.csv").is_file()
    names = {row["Name"] for row in report.locust_rows}
    assert {"chat", "Aggregated"} <= names
    chat = next(row for row in report.locust_rows if row["Name"] == "chat")
    assert int(chat["Request Count"]) > 0
    assert report.rejected == 0, report.render()
    assert report.limit_per_s == pytest.approx(2 * RPM / 60)
    # A smoke test on a shared machine: the 95% yardstick is `make stack-locust`'s job.
    assert report.share >= 0.8, report.render()
    assert "PASS" in report.render() or report.share < run.min_share
