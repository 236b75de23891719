"""Anthropic's input-token limit, paced exactly across replicas: two proxy processes share
a real Redis in front of a fake Anthropic upstream that enforces a strict sliding window of
input tokens (its ITPM); the deployment states the same limit. Demand is twice it: the
upstream must reject nothing and at least 90% of its limit must be used.

The figure each run measures is printed (``-s`` shows it); docs/benchmarks.md records it.
The assertions are the issue's targets, not timings."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.load import drive
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
    pytest.mark.slow,  # bounded load for many seconds: `make test-fast` skips it
]

WINDOW = 10.0  # the upstream's strict sliding window, seconds
INPUT_LIMIT = 3000  # input tokens it takes in any window: 300 a second
PER_SECOND = INPUT_LIMIT / WINDOW
# 12 s of load: the upstream's 10 s window slides past the first turns while demand
# still presses, so every window it checks, full ones included, holds paced turns; the
# figure is a rate over the span the upstream admitted requests (the first one's tokens
# left out), not a count, so a shorter run keeps its margin.
DURATION = 12.0
# 400 characters: the fake counts ceil(400 / 4) + 3 + 3 = 106 input tokens (the proxy
# estimates 108 and settles to the 106 reported).
BODY = {
    "model": "claude",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "x" * 400}],
}
INPUT = 106


def test_input_tokens_are_paced_as_anthropic_enforces_them(tmp_path: Path) -> None:
    upstream_config = FakeUpstreamConfig(
        port=0, itpm=INPUT_LIMIT, window=WINDOW, latency=0.02, api_key="sk-ant-upstream"
    )
    with run_in_thread(upstream_config) as upstream, ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = {
            "redis": {"url": redis.url},
            "models": [
                {
                    "name": "claude",
                    "deployments": [
                        {
                            "id": "anthropic",
                            "provider": "anthropic",
                            "base_url": upstream.url,
                            "api_key": "sk-ant-upstream",
                            "timeout": "10s",
                            # The upstream's limit as Anthropic states it: per minute.
                            "limits": [{"input_tokens": round(PER_SECOND * 60), "per": "1m"}],
                        }
                    ],
                }
            ],
            "routing": {"max_wait": "5s", "retries": 0},
        }
        proxies = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        upstream.reset()
        rate = 2 * PER_SECOND / INPUT
        urls = [p.base_url for p in proxies]
        result = asyncio.run(drive(urls, rate, DURATION, body=BODY, path="/messages"))
        stats = upstream.stats()
    # Input tokens admitted after the first, over the span between the first admission
    # and the last (the queue drains past the load's end).
    used = (stats["prompt_tokens_served"] - INPUT) / (PER_SECOND * stats["admitted_span"])
    print(
        f"\ninput tokens: {used:.1%} of the limit over {stats['admitted_span']:.1f} s;"
        f" upstream 429s {stats['rejected']}; clients: {dict(result.statuses)}"
        f" {dict(result.codes)}"
    )
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes)
    assert stats["rejected"] == 0, stats
    assert result.count(200) == stats["served"]
    assert used >= 0.90, stats
