"""Every dashboard panel shows data: a real Prometheus scrapes a real proxy under a short,
bounded load with two deployments, one failing and cooling down; then every PromQL
expression of every panel returns a series, and the key numbers agree with what this
test sent (and one reload, SIGHUP, on the reloads panel)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.prometheus import PrometheusServer, dashboard_queries, require_prometheus, value
from support.proxy_server import ProxyProcess

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-dashboards"
SHADOW_KEY = "sk-shadow"  # 2 a day, in shadow mode: its 3rd to 5th requests are counted
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.fixture
def upstreams() -> Iterator[tuple[FakeUpstreamHandle, FakeUpstreamHandle]]:
    with (
        run_in_thread(FakeUpstreamConfig(port=0, rpm=100_000, window=60)) as good,
        run_in_thread(FakeUpstreamConfig(port=0, fail_rate=1.0)) as bad,
    ):
        yield good, bad


def _config(good: FakeUpstreamHandle, bad: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "keys": [
            {
                "name": "team",
                "key": KEY,
                "rpm": 30,
                "tpm": 100_000,
                "budgets": [{"tokens": 100_000_000, "period": "day"}],
            },
            {"name": "batch", "key": SHADOW_KEY, "rpd": 2, "shadow": True},
        ],
        "models": [
            {
                "name": "m",
                "price": {"input": 1.0, "output": 2.0},  # the spend panels
                "deployments": [
                    # 20 per second, one at a time: concurrent requests wait their turn.
                    {"id": "good", "base_url": good.base_url, "rpm": 1200, "tpm": 1_000_000},
                    {"id": "bad", "base_url": bad.base_url, "rpm": 1200},
                ],
            }
        ],
        "routing": {
            "strategy": "weighted-random",
            "retries": 1,
            "cooldown": {"allowed_fails": 2, "window": "60s", "time": "120s"},
        },
    }


async def _traffic(url: str) -> Counter[int]:
    statuses: Counter[int] = Counter()
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as client:

        async def plain() -> None:
            response = await client.post(f"{url}/chat/completions", json=CHAT)
            statuses[response.status_code] += 1

        async def streamed() -> None:
            body = {**CHAT, "stream": True}
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass
                statuses[response.status_code] += 1

        # One at a time until the bad deployment has failed twice and cooled down...
        for _ in range(8):
            await plain()
        # ...then bursts that wait for their turn, streams, and more than the key allows.
        await asyncio.gather(*(plain() for _ in range(10)), *(streamed() for _ in range(6)))
        await asyncio.gather(*(plain() for _ in range(16)))
        shadowed = {"authorization": f"Bearer {SHADOW_KEY}"}
        for _ in range(5):
            response = await client.post(f"{url}/chat/completions", json=CHAT, headers=shadowed)
            statuses[response.status_code] += 1
    return statuses


@pytest.mark.slow
def test_every_dashboard_query_returns_a_series_and_the_numbers_agree(
    tmp_path: Path, upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle]
) -> None:
    require_prometheus()
    good, bad = upstreams
    with ProxyProcess(_config(good, bad), tmp_path) as proxy:
        target = proxy.url.removeprefix("http://")
        with PrometheusServer([target]) as prometheus:
            prometheus.wait_for_targets_up()
            statuses = asyncio.run(_traffic(proxy.base_url))
            sent = sum(statuses.values())
            # One reload (the same file) for the reloads panel.
            assert proxy.process is not None
            os.kill(proxy.process.pid, signal.SIGHUP)
            prometheus.wait_for(
                'sum(llmproxy_config_reloads_total{result="success"})',
                lambda r: bool(r) and value(r[0]) == 1,
            )
            prometheus.wait_for(
                "sum(llmproxy_requests_total)", lambda r: bool(r) and value(r[0]) == sent
            )
            # rate() needs two samples of a series: also of those born during the traffic.
            for born_late in (
                "llmproxy_requests_total",
                "llmproxy_rate_limited_total",
                "llmproxy_time_to_first_token_seconds_count",
                "llmproxy_deployment_failures_total",
                "llmproxy_config_reloads_total",
            ):
                prometheus.wait_for(f"sum(rate({born_late}[1m]))")
            empty = [
                f"{q.dashboard} / {q.panel} / {q.ref_id}: {q.expr}"
                for q in dashboard_queries()
                if not prometheus.query(q.expr)
            ]
            rate_limited = _value(prometheus, 'sum(llmproxy_requests_total{status="429"})')
            key_429s = _value(prometheus, 'sum(llmproxy_rate_limited_total{scope="key_rpm"})')
            shadowed = _value(
                prometheus, 'sum(llmproxy_shadow_rejections_total{key="batch",limit="key_rpd"})'
            )
            cooldowns = _value(prometheus, "sum(llmproxy_deployment_cooldowns_total)")
            bad_cooling = _value(prometheus, 'max(llmproxy_deployment_state{deployment="bad"})')
        logs = proxy.logs()
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert statuses[429] > 0 and rate_limited == statuses[429] == key_429s
    assert statuses[200] + statuses[429] == sent
    assert cooldowns == len(re.findall(r'"message":"deployment cooling down', logs)) == 1
    assert bad_cooling == 1
    assert shadowed == 3


def _value(prometheus: PrometheusServer, promql: str) -> float:
    result = prometheus.query(promql)
    assert result, promql
    return float(result[0]["value"][1])
