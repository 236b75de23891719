"""A stored response's follow-ups against a key's budget: the official OpenAI SDK through
one, then two proxies sharing a real Redis, in front of the fake upstream, which bills a
follow-up the whole conversation again (its input counts the previous response's input
and output, as OpenAI does). Forty follow-ups at once never spend past a budget in
tokens or in dollars, and ``/admin/state`` agrees with ``/admin/spend`` once they are
settled (issue 51, N1: 1.45x the budget on one replica, 3.14x on two)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

KEY = "sk-follow-ups"
ADMIN = "admin-follow-ups"
MODEL = "gpt-4o-mini"
PRICE = {"input": 20.0, "output": 80.0}  # USD per 1M tokens
CONVERSATION = "word " * 1200  # ~1,500 tokens, which every follow-up makes the upstream read again
FOLLOW_UPS = 40
BUDGETS: dict[str, dict[str, Any]] = {
    "tokens": {"tokens": 20_000, "period": "day"},
    "usd": {"usd": 0.5, "period": "day"},
}


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0.001)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, redis_url: str, budget: dict[str, Any]) -> dict[str, Any]:
    return {
        # Not a test of Redis failing: a healthy Redis call that a loaded host delays past
        # the default 100 ms would refuse a follow-up with 503 affinity_unavailable.
        "redis": {"url": redis_url, "timeout": "1s"},
        "keys": [{"name": "alice", "key": KEY, "budgets": [budget]}],
        "models": [
            {
                "name": MODEL,
                "price": PRICE,
                "deployments": [{"id": "d1", "base_url": upstream.base_url}],
            }
        ],
        "routing": {"retries": 0},
        "admin": {"keys": [ADMIN]},
    }


async def _follow_ups(
    proxies: list[ProxyInThread], previous: str
) -> list[openai.types.responses.Response | openai.APIStatusError]:
    """``FOLLOW_UPS`` continuations of ``previous`` at once, alternating replicas."""
    clients = [
        openai.AsyncOpenAI(base_url=p.base_url, api_key=KEY, max_retries=0, timeout=60)
        for p in proxies
    ]

    async def one(n: int) -> openai.types.responses.Response | openai.APIStatusError:
        try:
            return await clients[n % len(clients)].responses.create(
                model=MODEL, input="and?", previous_response_id=previous, max_output_tokens=16
            )
        except openai.APIStatusError as error:
            return error

    try:
        return await asyncio.gather(*(one(n) for n in range(FOLLOW_UPS)))
    finally:
        for client in clients:
            await client.close()


def _admin(proxy: ProxyInThread, path: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{proxy.url}/admin/{path}", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def _reported(proxy: ProxyInThread, kind: str, spent: float) -> float:
    """The spend report's total of ``kind`` once it shows ``spent`` (each replica writes
    its spend once a second), or as it stands after 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        rows = _admin(proxy, "spend?period=day")["current"]["spend"]
        total = sum(
            r["usd"] if kind == "usd" else r["input_tokens"] + r["output_tokens"] for r in rows
        )
        if total == pytest.approx(spent) or time.monotonic() > deadline:
            return float(total)
        time.sleep(0.2)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["tokens", "usd"])
def test_follow_ups_at_once_never_spend_past_the_budget(
    upstream: FakeUpstreamHandle, redis_url: str, replicas: int, kind: str
) -> None:
    budget = BUDGETS[kind]
    limit = float(budget[kind])
    settings = settings_from(_config(upstream, redis_url, budget))
    with ExitStack() as stack:
        proxies = [stack.enter_context(ProxyInThread(settings)) for _ in range(replicas)]
        client = openai.OpenAI(base_url=proxies[0].base_url, api_key=KEY, max_retries=0)
        created = client.responses.create(model=MODEL, input=CONVERSATION, max_output_tokens=16)
        assert created.usage is not None and created.usage.input_tokens > 1_500
        answers = asyncio.run(_follow_ups(proxies, created.id))
        for proxy in proxies:
            proxy.settled()
        stats = upstream.stats()
        tokens = stats["prompt_tokens_served"] + stats["completion_tokens_served"]
        usd = (
            stats["prompt_tokens_served"] * PRICE["input"]
            + stats["completion_tokens_served"] * PRICE["output"]
        ) / 1e6
        spent = float(tokens) if kind == "tokens" else usd
        served = [a for a in answers if not isinstance(a, openai.APIStatusError)]
        refused = [a for a in answers if isinstance(a, openai.APIStatusError)]
        print(
            f"\n{replicas} replica(s), {kind}: {len(served)} of {FOLLOW_UPS} follow-ups served,"
            f" {spent:g} spent of {limit:g} ({spent / limit:.2f}x)"
        )
        # Every follow-up served was billed the conversation again.
        assert all(a.usage is not None and a.usage.input_tokens > 1_500 for a in served)
        assert served, "not one follow-up fitted"
        assert spent <= limit
        for error in refused:
            assert error.status_code == 429
            assert error.code == f"key_budget_{kind}_day"
        # What the budget holds is what was spent: the state and the report agree.
        [state] = _admin(proxies[-1], "state")["keys"][0]["budgets"]
        assert state["spent"] == pytest.approx(spent)
        assert _reported(proxies[-1], kind, spent) == pytest.approx(spent)
