"""A team's limits across replicas: two `llm-proxy serve` processes share one real Redis;
two keys of a team allowed 6 requests send 5 each, alternating replicas, all at once: 6
get through in all, the rest are 429 ``team_rpd``, and the keys' and the team's windows
(one hash slot: the team's) hold exactly what passed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ADMIN = "adm-teams-e2e"
KEYS = {"alice": "sk-alice-e2e", "bob": "sk-bob-e2e"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, latency=0.02)) as handle:
        yield handle


def _config(redis_url: str, upstream: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        # A day's window: nothing refills while the test runs, however slow the machine.
        "teams": [{"name": "research", "rpd": 6}],
        "keys": [
            {"name": name, "key": secret, "team": "research", "rpd": 5}
            for name, secret in KEYS.items()
        ],
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
        "routing": {"retries": 0},
        "admin": {"keys": [ADMIN]},
    }


async def _burst(proxies: list[ProxyProcess]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{proxies[i % 2].base_url}/chat/completions",
                    json=CHAT,
                    headers={"authorization": f"Bearer {secret}"},
                )
                for i in range(5)
                for secret in KEYS.values()
            )
        )


def test_two_keys_of_a_team_on_two_replicas_get_6_through_in_all(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = _config(redis.url, upstream)
        proxies = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        answers = asyncio.run(_burst(proxies))
        state = httpx.get(
            f"{proxies[1].url}/admin/state",
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
        ).json()
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 6 and statuses.count(429) == 4, statuses
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 429} == {"team_rpd"}
    assert upstream.stats()["served"] == 6
    [team] = state["teams"]
    assert round(team["windows"][0]["remaining"]) == 0
    spent = [5 - round(k["windows"][0]["remaining"]) for k in state["keys"]]
    assert sum(spent) == 6  # what the keys were charged is what passed
