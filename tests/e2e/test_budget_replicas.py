"""Budgets with real processes: two proxy replicas sharing a real Redis never pass a
key's budget together, and the spend survives a proxy restart and a Redis restart with
its append-only file (docs/production.md). Issue 30's acceptance criteria."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

KEY = "sk-budgeted"
ADMIN = "admin-secret"
OUTPUT = 100
PRICE = {"input": 1.0, "output": 1000.0}  # a request: ~0.1 USD, nearly all output
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": OUTPUT}
HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, completion_tokens=OUTPUT, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


def config(upstream: FakeUpstreamHandle, redis_url: str, budget: float) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "alice", "key": KEY, "budgets": [{"usd": budget, "period": "month"}]}],
        "models": [
            {
                "name": "m",
                "price": PRICE,
                "deployments": [{"id": "d1", "base_url": upstream.base_url}],
            }
        ],
        "routing": {"retries": 0},
        "admin": {"keys": [ADMIN]},
    }


def priced(answer: httpx.Response) -> float:
    usage = answer.json()["usage"]
    return (
        usage["prompt_tokens"] * PRICE["input"] + usage["completion_tokens"] * PRICE["output"]
    ) / 1e6


async def spread(urls: list[str], n: int) -> list[httpx.Response]:
    """``n`` requests at once, alternating between the replicas."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        targets = itertools.islice(itertools.cycle(urls), n)
        return await asyncio.gather(
            *(client.post(f"{u}/chat/completions", json=CHAT, headers=HEADERS) for u in targets)
        )


def report(url: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{url}/admin/spend", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def test_two_replicas_never_pass_a_budget_together(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    budget = 1.0  # about ten requests' cost
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        data = config(upstream, redis.url, budget)
        replicas = start_together(
            stack, [ProxyProcess(data, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        urls = [r.base_url for r in replicas]
        answers = asyncio.run(spread(urls, 60))
        for i in range(6):
            answers += asyncio.run(spread(urls[i % 2 :], 1))
        passed = [a for a in answers if a.status_code == 200]
        spent = sum(priced(a) for a in passed)
        print(f"\n2 replicas: {len(passed)} of {len(answers)} passed, {spent:.6f} USD of {budget}")
        assert spent <= budget
        assert spent >= budget - 2 * priced(passed[0])
        for a in answers:
            if a.status_code != 200:
                assert a.status_code == 429
                assert a.json()["error"]["code"] == "key_budget_usd_month"
                assert float(a.headers["retry-after"]) > 0
        # Each replica's spend reaches the shared report within its write interval.
        deadline = asyncio.run(_reported(replicas[0].url, spent))
        assert deadline, "the report never showed every replica's spend"


async def _reported(url: str, spent: float, within: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while loop.time() < until:
        rows = report(url)["current"]["spend"]
        if rows and abs(rows[0]["usd"] - spent) < 1e-9:
            return True
        await asyncio.sleep(0.2)
    return False


def test_spend_survives_a_proxy_restart_and_a_redis_restart_with_aof(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    budget = 0.5  # about five requests' cost
    redis = RedisServer(tmp_path / "redis", None, "--appendonly", "yes", "--appendfsync", "always")
    with redis:
        data = config(upstream, redis.url, budget)
        with ProxyProcess(data, tmp_path, name="first") as proxy:
            first = asyncio.run(spread([proxy.base_url], 3))
        # Stopped: its pending spend was written at shutdown.
        spent = sum(priced(a) for a in first)
        assert [a.status_code for a in first] == [200, 200, 200]
        redis.stop()
        redis.start()
        with ProxyProcess(data, tmp_path, name="second") as proxy:
            rows = report(proxy.url)["current"]["spend"]
            assert rows[0]["usd"] == pytest.approx(spent)
            assert rows[0]["requests"] == 3
            # The budget remembers the three: only one more fits in 0.5 USD.
            more = [asyncio.run(spread([proxy.base_url], 1))[0] for _ in range(3)]
        codes = [a.status_code for a in more]
        assert codes == [200, 429, 429]
