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
from support.proxy_server import ProxyInThread, ProxyProcess, settings_from, start_together
from support.redis_server import RedisServer, redis_available
from support.waiting import wait_until

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


def _usable(proxy: ProxyProcess) -> int:
    ready = httpx.get(f"{proxy.url}/health/ready", timeout=2).json()
    return int(ready["deployments_usable"])


# Seconds of load per failure mode: the bad deployment cools after 2 failures and is
# probed once per 2 s cooldown, so each mode sees it cooled, probed and cooled again.
PHASE = 3.0


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
        proxies = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"r{i}") for i in range(2)]
        )
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
                result = await drive(urls, 20, PHASE, body=CHAT)
                phases.append((name, bad.stats()["requests"] - before, dict(result.statuses)))
            bad.control(drop_rate=0.0)
            for p in proxies:  # the last cooldown ends: both deployments usable again
                await asyncio.to_thread(
                    wait_until, lambda p=p: _usable(p) == 2, 10.0, "cooldown over"
                )
            before = bad.stats()["served"]
            result = await drive(urls, 20, 2.0, body=CHAT)
            phases.append(("healed", bad.stats()["served"] - before, dict(result.statuses)))

        asyncio.run(scenario())
    print(f"\n{phases}")
    for name, reached_bad, statuses in phases:
        # Every client request succeeded: failures were retried on the good deployment.
        assert set(statuses) == {200}, (name, statuses)
        if name != "healed":
            # Cooled after allowed_fails (shared by both replicas), then one probe per
            # 2 s cooldown, plus the requests already in flight when it cooled.
            assert reached_bad <= 2 + PHASE / 2 + 6, (name, reached_bad)
    assert phases[-1][1] > 10  # back in rotation


@pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it
def test_a_limit_configured_too_high_is_learned_from_the_upstream(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    real, _ = upstreams
    real.control(rpm=120, window=60.0)  # 2 per second, strictly
    config = _config(_deployment("d", real, rpm=240), max_wait="2s", retries=0)
    # 12 s of load: the upstream's answers state its limit from the first one on, and the
    # served count (a rate over the run, with the queue's drain) keeps its margin.
    duration = 12.0
    with ProxyInThread(settings_from(config)) as proxy:
        result = asyncio.run(drive([proxy.base_url], 6, duration, body=CHAT))
    stats = real.stats()
    print(
        f"\ntoo high: served {stats['served']} in {duration:.0f} s of load"
        f" (over {stats['admitted_span']:.1f} s), upstream 429s {stats['rejected']} of"
        f" {stats['requests']}; clients: {dict(result.statuses)}"
    )
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


def test_requests_arriving_while_a_probe_is_out_wait_for_its_answer(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    """The only deployment failed and is cooled for 1 s; five requests arrive: they wait
    out the cooldown, one of them goes as the half-open probe (the upstream takes 1 s to
    answer it), and the other four wait for the probe's answer within their max_wait
    (its deadline, the deployment's 30 s timeout, is only the latest it can come), then
    are served: five 200s, no 503."""
    only, _ = upstreams
    config = _config(
        _deployment("only", only, timeout="30s"),
        max_wait="5s",
        retries=0,
        cooldown={"allowed_fails": 1, "window": "10s", "time": "1s"},
    )
    only.control(fail_rate=1.0, fail_status=500)
    with ProxyInThread(settings_from(config)) as proxy:
        failed = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
        assert failed.status_code == 502  # the failure that cools it
        only.control(fail_rate=0.0, latency=1.0)

        async def five() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                url = f"{proxy.base_url}/chat/completions"
                return list(await asyncio.gather(*(client.post(url, json=CHAT) for _ in range(5))))

        answers = asyncio.run(five())
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert only.stats()["by_status"] == {"500": 1, "200": 5}


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


# -- what an upstream's refusal does, and fallback groups -------------------------------


def _sdk(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


def test_an_upstream_401_cools_its_deployment_and_the_request_is_served_elsewhere(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    """A rejected upstream key is the deployment's fault, not the client's: the request is
    retried on another deployment, and the bad one is cooled (nothing more is sent to it
    for cooldown.time). With no other deployment, 502 upstream_auth_error, and the key
    the upstream rejected is named nowhere."""
    rejecting, good = upstreams
    rejecting.control(api_key="sk-the-right-one")
    wrong = {"api_key": "sk-the-wrong-one"}
    config = _config(  # the weight makes "rejecting" the first choice while it is usable
        _deployment("rejecting", rejecting, weight=1e9, **wrong),
        _deployment("good", good),
        retries=1,
    )
    with ProxyInThread(settings_from(config)) as proxy:
        client = _sdk(proxy)
        answers = [client.chat.completions.create(**CHAT) for _ in range(5)]  # type: ignore[call-overload]
    assert all(a.choices[0].message.content for a in answers)
    assert rejecting.stats()["by_status"] == {"401": 1}  # tried once, then cooled
    assert good.stats()["served"] == 5

    alone = _config(_deployment("rejecting", rejecting, **wrong), retries=0)
    with (
        ProxyInThread(settings_from(alone)) as proxy,
        pytest.raises(openai.APIStatusError) as refused,
    ):
        _sdk(proxy).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert refused.value.status_code == 502
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "upstream_auth_error"
    assert "sk-the-wrong-one" not in refused.value.response.text


def test_an_upstream_429_holds_its_deployment_and_the_request_is_served_elsewhere(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    """A 429 from an upstream whose limit we did not know: the request goes to another
    deployment at once, and the refusing one is held until its retry-after (no further
    request reaches it meanwhile). With nothing else to try: 503 upstream_rate_limited."""
    limited, good = upstreams
    limited.control(rpm=1, window=60.0)  # one request a minute; the next gets 429
    config = _config(  # the weight makes "limited" the first choice while it is usable
        _deployment("limited", limited, weight=1e9), _deployment("good", good), retries=1
    )
    with ProxyInThread(settings_from(config)) as proxy:
        client = _sdk(proxy)
        answers = [client.chat.completions.create(**CHAT) for _ in range(6)]  # type: ignore[call-overload]
    assert all(a.choices[0].message.content for a in answers)
    assert limited.stats()["by_status"] == {"200": 1, "429": 1}
    assert good.stats()["served"] == 5

    limited.reset()
    alone = _config(_deployment("limited", limited), retries=0, max_wait=0)
    with ProxyInThread(settings_from(alone)) as proxy:
        client = _sdk(proxy)
        client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert refused.value.status_code == 503
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "upstream_rate_limited"


def test_fallback_groups_serve_a_request_its_own_group_cannot(
    upstreams: tuple[FakeUpstreamHandle, FakeUpstreamHandle],
) -> None:
    """routing.fallbacks: when every deployment of the requested group failed, or none has
    a turn within max_wait, the next group in the list answers, plain and streamed; the
    client sees a normal answer. routing.retries bounds the attempts after the first in
    all, fallback groups included."""
    failing, spare = upstreams
    failing.control(fail_rate=1.0, fail_status=500)
    models = [
        {"name": "big", "deployments": [_deployment("failing", failing)]},
        {"name": "small", "deployments": [_deployment("spare", spare)]},
    ]
    config = {"models": models, "routing": {"retries": 1, "fallbacks": {"big": ["small"]}}}
    with ProxyInThread(settings_from(config)) as proxy:
        client = _sdk(proxy)
        plain = client.chat.completions.create(**{**CHAT, "model": "big"})  # type: ignore[call-overload]
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(**{**CHAT, "model": "big"}, stream=True)  # type: ignore[call-overload]
            if chunk.choices
        )
    assert plain.choices[0].message.content and streamed
    assert failing.stats()["by_status"] == {"500": 2}
    assert spare.stats()["served"] == 2

    # Out of budget: one request a minute on "big", no waiting; no retry needed to fall back.
    failing.control(fail_rate=0.0)
    models[0]["deployments"] = [_deployment("failing", failing, rpm=1)]
    config = {
        "models": models,
        "routing": {"retries": 0, "max_wait": 0, "fallbacks": {"big": ["small"]}},
    }
    with ProxyInThread(settings_from(config)) as proxy:
        client = _sdk(proxy)
        answers = [client.chat.completions.create(**{**CHAT, "model": "big"}) for _ in range(3)]  # type: ignore[call-overload]
    assert all(a.choices[0].message.content for a in answers)
    assert failing.stats()["served"] == 1
    assert spare.stats()["served"] == 2 + 2
