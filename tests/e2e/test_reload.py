"""Reload under load, as an operator does it: two replicas (`llm-proxy serve` processes)
share one Redis; one is sent SIGHUP, the other POST /admin/reload. The new file rotates a
key, lowers a key's limit and adds a deployment; not one request of the steady load
fails. An invalid file during the same load changes nothing and is reported. And under
`--workers 2`, SIGHUP to the serve process reloads both workers in place."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.load import CHAT, LoadResult, drive
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ADMIN = "adm-e2e"
STEADY, OLD, NEW, LIMITED = "sk-steady", "sk-rotated-old", "sk-rotated-new", "sk-limited"
RATE = 15.0  # requests a second of steady load
# Seconds of steady load: the reloads begin 3 s in and took ~1 s (quiet or busy host), so
# a reload 6 times slower still ends under load, and the load goes on under the new
# config for seconds more.
DURATION = 10.0


def _config(
    redis_url: str, upstreams: list[FakeUpstreamHandle], rotating: str, limited_rpm: int
) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "keys": [
            {"name": "steady", "key": STEADY},
            {"name": "rotating", "key": rotating},
            {"name": "limited", "key": LIMITED, "rpm": limited_rpm},
        ],
        "models": [
            {
                "name": "gpt-4o-mini",
                "deployments": [
                    {"id": f"d{i}", "base_url": u.base_url, "api_key": f"up-{i}", "timeout": "10s"}
                    for i, u in enumerate(upstreams)
                ],
            }
        ],
        "routing": {"retries": 0, "max_wait": "5s"},
        "admin": {"keys": [ADMIN]},
    }


@pytest.fixture
def upstreams() -> Iterator[list[FakeUpstreamHandle]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(run_in_thread(FakeUpstreamConfig(port=0, latency=0.02)))
            for _ in range(2)
        ]


def _status(proxy: ProxyProcess, key: str) -> httpx.Response:
    return httpx.post(
        f"{proxy.base_url}/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


def _admin_reload(proxy: ProxyProcess) -> httpx.Response:
    return httpx.post(
        f"{proxy.url}/admin/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=40
    )


def _reloads(proxy: ProxyProcess, result: str) -> float:
    for line in httpx.get(f"{proxy.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'llmproxy_config_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


def _write_all(proxies: list[ProxyProcess], config: dict[str, Any] | str) -> None:
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    for proxy in proxies:
        proxy.config_path.write_text(text)


def _sighup(proxy: ProxyProcess) -> None:
    assert proxy.process is not None
    os.kill(proxy.process.pid, signal.SIGHUP)


@pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it
def test_a_reload_under_load_rotates_a_key_changes_a_limit_and_adds_a_deployment(
    tmp_path: Path, upstreams: list[FakeUpstreamHandle]
) -> None:
    first, added = upstreams
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        before = _config(redis.url, [first], OLD, limited_rpm=600)
        after = _config(redis.url, [first, added], NEW, limited_rpm=3)
        proxies = start_together(
            stack, [ProxyProcess(before, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        by_signal, by_post = proxies

        def reload_valid() -> None:
            assert all(_status(p, OLD).status_code == 200 for p in proxies)
            _write_all(proxies, after)
            _sighup(by_signal)
            response = _admin_reload(by_post)
            assert response.status_code == 200, response.text
            assert response.json()["deployments"]["added"] == ["gpt-4o-mini/d1"]
            # The signalled replica answers nothing: its new key working says it is done.
            wait_until(lambda: _status(by_signal, NEW).status_code == 200, 10.0, "SIGHUP reload")
            for proxy in proxies:
                assert _status(proxy, OLD).status_code == 401
                assert _status(proxy, NEW).status_code == 200
            # 3 a minute, shared through Redis: the fourth request on either replica is refused.
            statuses = [_status(proxies[i % 2], LIMITED) for i in range(4)]
            assert [r.status_code for r in statuses] == [200, 200, 200, 429]
            assert statuses[3].json()["error"]["code"] == "key_rpm"
            assert statuses[3].headers["x-ratelimit-limit-requests"] == "3"
            wait_until(lambda: added.stats()["served"] > 0, 10.0, "the added deployment used")

        def reload_invalid() -> None:
            _write_all(proxies, "keys:\n  - {name: steady}\nmodels: []\nrouting: {retries: -1}\n")
            response = _admin_reload(by_post)
            assert response.status_code == 400
            message = response.json()["error"]["message"]
            assert "3 problem(s)" in message
            assert "keys[0]" in message and "models" in message and "routing.retries" in message
            assert _reloads(by_post, "failure") == 1.0
            _sighup(by_signal)
            wait_until(lambda: _reloads(by_signal, "failure") == 1.0, 10.0, "failure counted")
            for proxy in proxies:  # nothing changed
                assert _status(proxy, NEW).status_code == 200
                assert _status(proxy, OLD).status_code == 401
                assert _reloads(proxy, "success") == 1.0

        async def scenario() -> LoadResult:
            loop = asyncio.get_running_loop()
            started = loop.time()
            load = asyncio.create_task(
                drive([p.base_url for p in proxies], RATE, DURATION, api_key=STEADY)
            )
            await asyncio.sleep(3.0)  # steady load under the first config
            await asyncio.to_thread(reload_valid)
            await asyncio.to_thread(reload_invalid)
            print(f"\nreloads done {loop.time() - started:.1f} s into {DURATION:.0f} s of load")
            assert not load.done(), "the reloads should happen under load"
            return await load

        result = asyncio.run(scenario())
    assert len(result.outcomes) == result.sent
    assert set(result.statuses) == {200}, (result.statuses, result.codes)


def test_sighup_or_post_to_a_serve_with_two_workers_reloads_both_in_place(
    tmp_path: Path, upstreams: list[FakeUpstreamHandle]
) -> None:
    config = _config("", upstreams[:1], OLD, limited_rpm=600)
    del config["redis"]
    with ProxyProcess(config, tmp_path, workers=2) as proxy:
        seen: set[str] = set()

        def worker_of(response: httpx.Response) -> str:
            return response.headers["x-request-id"][4:20]  # the process's id prefix

        def answered_by_both(key: str, status: int) -> bool:
            # A new connection each time: the kernel hands it to either worker.
            response = _status(proxy, key)
            if response.status_code == status:
                seen.add(worker_of(response))
            return len(seen) == 2

        wait_until(lambda: answered_by_both(OLD, 200), 20.0, "both workers answering")
        pids_before = set(seen)
        proxy.config_path.write_text(yaml.safe_dump(_config("", upstreams[:1], NEW, 600)))
        _sighup(proxy)
        seen = set()
        wait_until(lambda: answered_by_both(NEW, 200), 20.0, "both workers on the new key")
        assert seen == pids_before  # reloaded in place: the same two processes
        for _ in range(10):
            assert _status(proxy, OLD).status_code == 401
        assert _reloads(proxy, "success") == pytest.approx(1.0)  # 1/2 from each worker
        # POST /admin/reload to one worker reaches both (through the supervisor).
        proxy.config_path.write_text(yaml.safe_dump(_config("", upstreams[:1], OLD, 600)))
        response = _admin_reload(proxy)
        assert response.status_code == 200 and response.json()["keys"]["changed"] == ["rotating"]
        seen = set()
        wait_until(lambda: answered_by_both(OLD, 200), 20.0, "both workers on the old key again")
        assert seen == pids_before
        assert _reloads(proxy, "success") == pytest.approx(2.0)
