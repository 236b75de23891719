"""Shadow mode (keys[].shadow): a key's own limits are counted and their would-be
refusals reported, but its requests go on. Nothing is charged for a would-be refusal, as
nothing is for a real one, so the count is exactly what enforcing would have refused.
The key's x-ratelimit-* headers still describe its limits; deployment limits are never
shadowed. Through a real proxy, with the in-memory limiter and with a real Redis."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-shadowed"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0.001)) as handle:
        yield handle


@pytest.fixture(params=["memory", "redis"])
def redis(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def _proxy(
    upstream: FakeUpstreamHandle, redis: str, key: dict[str, Any], **deployment: Any
) -> ProxyInThread:
    deployments = [{"id": "d1", "base_url": upstream.base_url, **deployment}]
    config = {
        "redis": {"url": redis},
        "keys": [{"name": "batch", "key": KEY, "shadow": True, **key}],
        "models": [{"name": "m", "deployments": deployments}],
        "routing": {"retries": 0},
    }
    return ProxyInThread(settings_from(config))


async def _burst(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(
            *(client.post(f"{url}/chat/completions", json=CHAT, headers=HEADERS) for _ in range(n))
        )


def _shadow_count(proxy: ProxyInThread, limit: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=5).text
    pattern = rf'^llmproxy_shadow_rejections_total\{{key="batch",limit="{limit}"\}} (\S+)$'
    match = re.search(pattern, text, re.M)
    assert match is not None, f"no series for {limit}"
    return float(match.group(1))


def _shadow_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.shadow_rejection
        for r in caplog.records
        if r.name == "proxy.access" and getattr(r, "shadow_rejection", None)
    ]


@pytest.mark.slow
def test_a_burst_of_100_over_a_limit_of_60_is_served_and_exactly_40_are_counted(
    upstream: FakeUpstreamHandle, redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 60 a day: nothing refills while the burst lasts, however slow the machine.
    with (
        caplog.at_level(logging.INFO, logger="proxy.access"),
        _proxy(upstream, redis, {"rpd": 60, "tpd": 10_000_000}) as proxy,
    ):
        assert _shadow_count(proxy, "key_rpd") == 0  # there from the start
        assert _shadow_count(proxy, "key_tpd") == 0
        responses = asyncio.run(_burst(proxy.base_url, 100))
        assert [r.status_code for r in responses] == [200] * 100
        assert _shadow_count(proxy, "key_rpd") == 40
        assert _shadow_count(proxy, "key_tpd") == 0
        after = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=HEADERS)
        assert _shadow_count(proxy, "key_rpd") == 41
    assert after.status_code == 200
    # Its headers still say what enforcing would: none of 60 left.
    assert after.headers["x-ratelimit-limit-requests"] == "60"
    assert after.headers["x-ratelimit-remaining-requests"] == "0"
    assert upstream.stats()["served"] == 101
    assert _shadow_lines(caplog) == ["key_rpd"] * 41


@pytest.mark.slow
def test_max_parallel_is_shadowed_too(upstream: FakeUpstreamHandle, redis: str) -> None:
    # Each answer takes 2 s: the three requests are in flight together.
    upstream.control(latency=2.0)
    with _proxy(upstream, redis, {"max_parallel": 1}) as proxy:
        responses = asyncio.run(_burst(proxy.base_url, 3))
        assert [r.status_code for r in responses] == [200] * 3
        assert _shadow_count(proxy, "key_parallel") == 2


def test_deployment_limits_are_never_shadowed(upstream: FakeUpstreamHandle, redis: str) -> None:
    """A shadow key's request still waits for the deployment's turn and gets the model's
    429 when none comes within max_wait: shadow mode is about the key's own limits."""
    with _proxy(upstream, redis, {"rpm": 1000}, rpm=1) as proxy:
        first = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=HEADERS)
        # routing.max_wait defaults to 30 s; the next turn is a minute away.
        second = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=HEADERS)
    assert first.status_code == 200
    assert second.status_code == 429 and second.json()["error"]["code"] == "model_capacity"
    assert upstream.stats()["served"] == 1
