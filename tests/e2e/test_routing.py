"""Routing across deployments, end to end: real proxies, real fake upstreams, real Redis.

Failing deployments are cooled on every replica and probed back; a limit configured too
high is corrected from the upstream's answers; strategies split traffic as configured;
a model with every deployment cooling answers 503 with a retry-after the OpenAI SDK
honours; a stream that breaks after its first byte ends with an SSE error, not a retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.load import drive
from support.proxy_server import ProxyInThread, ProxyProcess, settings_from
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture
def upstreams() -> Iterator[tuple[FakeUpstreamHandle, FakeUpstreamHandle]]:
    with (
        run_in_thread(FakeUpstreamConfig(port=0)) as a,
        run_in_thread(FakeUpstreamConfig(port=0)) as b,
    ):
        yield a, b


def _config(*deployments: dict[str, Any], **routing: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "deployments": list(deployments)}], "routing": routing}


def _deployment(name: str, upstream: FakeUpstreamHandle, **extra: Any) -> dict[str, Any]:
    return {"id": name, "base_url": upstream.base_url, **extra}


@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")
def test_a_failing_deployment_is_cooled_on_every_replica_probed_and_restored(
    tmp_path: Path, upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle]
) -> None:
    good, bad = upstreams
    cooldown = {"allowed_fails": 2, "window": "30s", "time": "2s"}
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = {
            "redis": {"url": redis.url},
            **_config(
                _deployment("good", good, timeout="1s"),
                _deployment("bad", bad, timeout="0.5s"),
                strategy="weighted-random",
                retries=1,
                cooldown=cooldown,
            ),
        }
        proxies = [
            stack.enter_context(ProxyProcess(config, tmp_path, name=f"r{i}")) for i in range(2)
        ]
        urls = [p.base_url for p in proxies]
        phases: list[tuple[str, int, dict[str, int]]] = []

        async def scenario() -> None:
            for name, options in [
                ("500s", {"fail_rate": 1.0}),
                ("hangs", {"fail_rate": 0.0, "hang_rate": 1.0}),
                ("drops", {"hang_rate": 0.0, "drop_rate": 1.0}),
            ]:
                bad.control(**options)
                before = bad.stats()["requests"]
                result = await drive(urls, 20, 4.0, body=CHAT)
                phases.append((name, bad.stats()["requests"] - before, dict(result.statuses)))
            bad.control(drop_rate=0.0)
            await asyncio.sleep(2.5)  # the last cooldown ends
            before = bad.stats()["served"]
            result = await drive(urls, 20, 3.0, body=CHAT)
            phases.append(("healed", bad.stats()["served"] - before, dict(result.statuses)))

        asyncio.run(scenario())
    for name, reached_bad, statuses in phases:
        # Every client request succeeded: failures were retried on the good deployment.
        assert set(statuses) == {200}, (name, statuses)
        if name != "healed":
            # Cooled after allowed_fails (shared by both replicas), then one probe per
            # 2 s cooldown, plus the requests already in flight when it cooled.
            assert reached_bad <= 2 + 4.0 / 2 + 6, (name, reached_bad)
    assert phases[-1][1] > 10  # back in rotation


def test_a_limit_configured_too_high_is_learned_from_the_upstream(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    real, _ = upstreams
    real.control(rpm=120, window=60.0)  # 2 per second, strictly
    config = _config(_deployment("d", real, rpm=240), max_wait="2s", retries=0)
    duration = 20.0
    with ProxyInThread(settings_from(config)) as proxy:
        result = asyncio.run(drive([proxy.base_url], 6, duration, body=CHAT))
    stats = real.stats()
    assert set(result.statuses) <= {200, 429, 503}
    assert stats["rejected"] <= 0.01 * stats["requests"] + 1
    assert stats["served"] >= 0.9 * 2 * duration


def test_weighted_random_splits_traffic_by_weight(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    a, b = upstreams
    config = _config(
        _deployment("a", a, weight=3), _deployment("b", b, weight=1), strategy="weighted-random"
    )
    with ProxyInThread(settings_from(config)) as proxy:
        result = asyncio.run(_concurrently(proxy.base_url, 2000, 32))
    assert result == {200: 2000}
    share = a.stats()["served"] / 2000
    assert abs(share - 0.75) <= 0.05 * 0.75


def test_least_busy_balances_in_flight_when_one_deployment_is_slow(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    fast, slow = upstreams
    slow.control(latency=0.3)
    fast.control(latency=0.02)
    config = _config(_deployment("fast", fast), _deployment("slow", slow), strategy="least-busy")
    with ProxyInThread(settings_from(config)) as proxy:
        result = asyncio.run(_concurrently(proxy.base_url, 400, 16))
    assert result == {200: 400}
    f, s = fast.stats(), slow.stats()
    assert abs(f["max_in_flight"] - s["max_in_flight"]) <= 3, (f, s)
    assert f["served"] > 3 * s["served"]


def test_all_deployments_cooling_is_503_with_retry_after_and_the_sdk_recovers(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    only, _ = upstreams
    config = _config(
        _deployment("only", only),
        max_wait=0,
        retries=0,
        cooldown={"allowed_fails": 1, "window": "10s", "time": "2s"},
    )
    only.control(fail_rate=1.0, fail_status=500)
    with ProxyInThread(settings_from(config)) as proxy:
        first = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
        assert first.status_code == 502  # the failure itself
        cooling = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
        assert cooling.status_code == 503
        assert cooling.json()["error"]["code"] == "model_unavailable"
        assert 1 <= int(cooling.headers["retry-after"]) <= 2
        assert 0 < int(cooling.headers["retry-after-ms"]) <= 2000
        only.control(fail_rate=0.0)
        client = openai.OpenAI(base_url=proxy.base_url, api_key="x")  # default retries
        completion = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert completion.choices[0].message.content


def test_a_stream_broken_after_its_first_chunk_ends_with_an_error_event(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    broken, spare = upstreams
    broken.control(fail_after_chunks=2, stream_chunks=8)
    config = _config(_deployment("broken", broken, weight=1000), _deployment("spare", spare))
    with ProxyInThread(settings_from(config)) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
        received = []
        with pytest.raises(openai.APIError):
            for chunk in client.chat.completions.create(**CHAT, stream=True):  # type: ignore[call-overload]
                received.append(chunk)
    assert received  # the first chunks reached the client...
    assert spare.stats()["requests"] == 0  # ...so nothing was retried


async def _concurrently(url: str, total: int, concurrency: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    queue = iter(range(total))
    async with httpx.AsyncClient(timeout=30) as client:

        async def worker() -> None:
            for _ in queue:
                response = await client.post(f"{url}/chat/completions", json=CHAT)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses
