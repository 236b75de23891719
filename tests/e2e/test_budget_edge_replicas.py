"""``budget_edge: clamp`` with real processes: 50 requests at once from the official OpenAI
SDK, spread over two proxy replicas sharing a real Redis, against a key's budget that
pays about half of them. The budget is used to at least 98% and never passed (in tokens,
and in dollars at the model's price); the requests it could not pay whole went with the
output cap it had left and say so (``x-llm-proxy-clamped: 1``); with ``refuse`` (the
default) they are refused as before. The official Anthropic SDK (Messages' ``max_tokens``)
and the OpenAI SDK's Responses (``max_output_tokens``) alike. Issue 55's acceptance
criteria."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

KEY = "sk-edge"
ADMIN = "admin-edge"
CLAMPED = "x-llm-proxy-clamped"
REQUESTS = 50
PRICE = {"input": 1.0, "output": 1000.0}  # USD per 1M tokens: an output token is 1/1000 USD
# Per budget kind: the budget, and each request's output cap (about twice what it pays).
CASES: dict[str, tuple[dict[str, Any], int]] = {
    "tokens": ({"tokens": 500_000, "period": "day"}, 20_000),
    "usd": ({"usd": 25.0, "period": "month"}, 1_000),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    # An answer is as long as its cap lets it: the output counted is the cap it was sent.
    config = FakeUpstreamConfig(port=0, completion_tokens=1_000_000, chunk_delay=0.0)
    with run_in_thread(config) as handle:
        yield handle


def config(
    upstream: FakeUpstreamHandle, redis_url: str, budget: dict[str, Any], edge: str
) -> dict[str, Any]:
    key: dict[str, Any] = {"name": "alice", "key": KEY, "budgets": [budget]}
    if edge != "default":
        key["budget_edge"] = edge
    return {
        "redis": {"url": redis_url},
        "keys": [key],
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


@dataclass(frozen=True)
class Answer:
    status: int
    clamped: bool = False  # it said x-llm-proxy-clamped: 1
    output: int = 0  # completion tokens
    cost: dict[str, float] = field(default_factory=dict)  # tokens and usd, from its usage
    code: str | None = None  # a refusal's


async def one(client: openai.AsyncOpenAI, cap: int) -> Answer:
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=cap
        )
    except openai.APIStatusError as refused:
        assert CLAMPED not in refused.response.headers
        error = refused.body if isinstance(refused.body, dict) else {}
        return Answer(refused.status_code, code=error.get("code"))
    usage = raw.parse().usage
    assert usage is not None
    usd = (usage.prompt_tokens * PRICE["input"] + usage.completion_tokens * PRICE["output"]) / 1e6
    cost = {"tokens": float(usage.prompt_tokens + usage.completion_tokens), "usd": usd}
    return Answer(raw.status_code, raw.headers.get(CLAMPED) == "1", usage.completion_tokens, cost)


async def spread(urls: list[str], cap: int) -> list[Answer]:
    """``REQUESTS`` at once, alternating between the replicas."""
    clients = [
        openai.AsyncOpenAI(base_url=u, api_key=KEY, max_retries=0, timeout=120) for u in urls
    ]
    try:
        targets = itertools.islice(itertools.cycle(clients), REQUESTS)
        return await asyncio.gather(*(one(c, cap) for c in targets))
    finally:
        for c in clients:
            await c.close()


def budget_left(url: str) -> float:
    state = httpx.get(
        f"{url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    ).json()
    [budget] = next(k for k in state["keys"] if k["name"] == "alice")["budgets"]
    return float(budget["remaining"])


def settled_spend(url: str, limit: float, expected: float) -> float:
    """What the shared budget says was spent, once every replica's settlements are in
    (each goes with its replica's next round trip): read until it matches what the
    answers say they cost, or for a while."""
    seen = limit - budget_left(url)
    deadline = time.monotonic() + 15.0
    while abs(seen - expected) > 1e-6 * limit and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = limit - budget_left(url)
    return seen


@pytest.mark.parametrize(
    ("kind", "edge"), [("tokens", "clamp"), ("usd", "clamp"), ("tokens", "default")]
)
def test_fifty_requests_on_two_replicas_use_the_budget_to_the_end(
    tmp_path: Path, upstream: FakeUpstreamHandle, kind: str, edge: str
) -> None:
    budget, cap = CASES[kind]
    limit = float(budget[kind])
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        data = config(upstream, redis.url, budget, edge)
        replicas = start_together(
            stack, [ProxyProcess(data, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        answers = asyncio.run(spread([r.base_url for r in replicas], cap))
        passed = [a for a in answers if a.status == 200]
        spent = sum(a.cost[kind] for a in passed)
        in_redis = settled_spend(replicas[0].url, limit, spent)

    clamped = [a for a in passed if a.clamped]
    share = spent / limit
    print(
        f"\n{kind} budget, {edge}: {len(passed)} of {REQUESTS} served, {len(clamped)} clamped"
        f" (to {sorted(a.output for a in clamped)} of {cap}), spent {spent:g} of {limit:g}"
        f" ({share:.3%}; the shared budget says {in_redis:g})"
    )
    assert spent <= limit  # never passed
    assert abs(in_redis - spent) <= 1e-6 * limit  # the budget counts what the answers cost
    refused = {(a.status, a.code) for a in answers if a.status != 200}
    assert refused == {(429, f"key_budget_{kind}_{budget['period']}")}
    for answer in passed:
        assert answer.clamped == (answer.output < cap)  # a lowered cap, and only it, says so
    if edge == "clamp":
        assert clamped, "no request was clamped"
        assert share >= 0.98
    else:
        assert not clamped  # refuse: whole requests or none, as before


async def one_message(client: anthropic.AsyncAnthropic, cap: int) -> Answer:
    try:
        raw = await client.messages.with_raw_response.create(
            model="claude", max_tokens=cap, messages=[{"role": "user", "content": "hi"}]
        )
    except anthropic.APIStatusError as refused:
        assert CLAMPED not in refused.response.headers
        body = refused.body if isinstance(refused.body, dict) else {}
        return Answer(refused.status_code, code=body.get("error", {}).get("type"))
    message = await raw.parse()
    assert message.stop_reason == "max_tokens"  # as long as its cap let it be
    used = message.usage
    cost = {"tokens": float(used.input_tokens + used.output_tokens)}
    return Answer(raw.status_code, raw.headers.get(CLAMPED) == "1", used.output_tokens, cost)


async def one_response(client: openai.AsyncOpenAI, cap: int) -> Answer:
    try:
        raw = await client.responses.with_raw_response.create(
            model="m", input="hi", max_output_tokens=cap
        )
    except openai.APIStatusError as refused:
        assert CLAMPED not in refused.response.headers
        error = refused.body if isinstance(refused.body, dict) else {}
        return Answer(refused.status_code, code=error.get("code"))
    usage = raw.parse().usage
    assert usage is not None
    cost = {"tokens": float(usage.input_tokens + usage.output_tokens)}
    return Answer(raw.status_code, raw.headers.get(CLAMPED) == "1", usage.output_tokens, cost)


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_anthropic_and_responses_clients_get_their_cap_lowered_on_two_replicas(
    tmp_path: Path, upstream: FakeUpstreamHandle, api: str
) -> None:
    """20 at once of 20,000 output tokens against 210,000: ten whole, the eleventh sent
    with the ``max_tokens`` / ``max_output_tokens`` the budget has left, the rest 429."""
    budget, cap, n = {"tokens": 210_000, "period": "day"}, 20_000, 20
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        data = config(upstream, redis.url, budget, "clamp")
        data["models"].append(
            {
                "name": "claude",
                "deployments": [
                    {
                        "id": "a1",
                        "provider": "anthropic",
                        "base_url": upstream.url,
                        "api_key": "sk-ant-upstream-key",
                    }
                ],
            }
        )
        replicas = start_together(
            stack, [ProxyProcess(data, tmp_path, name=f"replica-{i}") for i in range(2)]
        )

        async def main() -> list[Answer]:
            if api == "messages":
                clients: list[Any] = [
                    anthropic.AsyncAnthropic(base_url=r.url, api_key=KEY, max_retries=0)
                    for r in replicas
                ]
                send: Any = one_message
            else:
                clients = [
                    openai.AsyncOpenAI(base_url=r.base_url, api_key=KEY, max_retries=0)
                    for r in replicas
                ]
                send = one_response
            try:
                targets = itertools.islice(itertools.cycle(clients), n)
                return await asyncio.gather(*(send(c, cap) for c in targets))
            finally:
                for c in clients:
                    await c.close()

        answers = asyncio.run(main())
        passed = [a for a in answers if a.status == 200]
        spent = sum(a.cost["tokens"] for a in passed)
        in_redis = settled_spend(replicas[0].url, 210_000.0, spent)

    clamped = [a for a in passed if a.clamped]
    print(
        f"\n{api}: {len(passed)} of {n} served, clamped to {[a.output for a in clamped]},"
        f" spent {spent:g} of 210000 ({spent / 210_000:.3%}; the shared budget says {in_redis:g})"
    )
    assert spent <= 210_000 and abs(in_redis - spent) <= 0.21
    assert clamped and all(a.output < cap for a in clamped)
    assert all(a.output == cap for a in passed if not a.clamped)
    assert {a.status for a in answers if a.status != 200} == {429}
    assert spent >= 0.98 * 210_000
