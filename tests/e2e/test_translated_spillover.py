"""A saturated OpenAI deployment spills over to an Anthropic one, translated (issue 54):
two proxy replicas share a real Redis in front of a model group of one OpenAI deployment
and one Anthropic deployment, each at a strict fake upstream that enforces its own
sliding window and states the same limit. Chat clients (the official openai SDK: plain,
streamed, with tools) ask for more than the OpenAI upstream takes: every request is
answered, the excess by the Anthropic deployment, and neither upstream answers a 429."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

KEY = "sk-client-spillover"
OPENAI_KEY = "sk-openai-upstream-secret"
ANTHROPIC_KEY = "sk-ant-upstream-secret"
WINDOW = 10.0  # each upstream's strict sliding window, seconds
OPENAI_LIMIT = 15  # requests it takes in any window: 1.5 a second
ANTHROPIC_LIMIT = 100  # 10 a second
RATE = 6.0  # chat requests a second, four times what the OpenAI upstream takes
COUNT = 36
USER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
    }
]


def _config(redis_url: str, gpt: FakeUpstreamHandle, claude: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "app", "key": KEY}],
        "models": [
            {
                "name": "mixed",
                "deployments": [
                    {
                        "id": "openai-d",
                        "base_url": gpt.base_url,
                        "api_key": OPENAI_KEY,
                        "model": "gpt-upstream",
                        "rpm": round(OPENAI_LIMIT * 60 / WINDOW),
                        "timeout": "10s",
                        # Preferred whenever it has a turn: the Anthropic one takes the rest.
                        "weight": 20,
                    },
                    {
                        "id": "anthropic-d",
                        "provider": "anthropic",
                        "base_url": claude.url,
                        "api_key": ANTHROPIC_KEY,
                        "model": "claude-upstream",
                        "rpm": round(ANTHROPIC_LIMIT * 60 / WINDOW),
                        "timeout": "10s",
                    },
                ],
            }
        ],
        "routing": {"max_wait": "10s", "retries": 0},
    }


async def _ask(client: openai.AsyncOpenAI, i: int) -> str:
    """One chat client's request, the ``i``-th: plain, streamed or with tools; what it
    got (its text, or the tool it was asked to call)."""
    await asyncio.sleep(i / RATE)
    if i % 3 == 0:
        answer = await client.chat.completions.create(model="mixed", messages=USER, max_tokens=8)
        return answer.choices[0].message.content or ""
    if i % 3 == 1:
        stream = await client.chat.completions.create(
            model="mixed", messages=USER, max_tokens=8, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    called = await client.chat.completions.create(model="mixed", messages=USER, tools=TOOLS)
    [call] = called.choices[0].message.tool_calls or []
    assert set(orjson.loads(call.function.arguments)) == {"input"}
    return call.function.name


async def _load(urls: list[str]) -> list[str | BaseException]:
    clients = [openai.AsyncOpenAI(base_url=u, api_key=KEY, max_retries=0, timeout=30) for u in urls]
    try:
        return await asyncio.gather(
            *(_ask(clients[i % len(clients)], i) for i in range(COUNT)), return_exceptions=True
        )
    finally:
        for client in clients:
            await client.close()


def test_chat_clients_beyond_the_openai_upstream_are_served_by_the_anthropic_one(
    tmp_path: Path,
) -> None:
    strict = {"latency": 0.02, "window": WINDOW, "chunk_delay": 0.001}
    with (
        run_in_thread(
            FakeUpstreamConfig(port=0, api_key=OPENAI_KEY, rpm=OPENAI_LIMIT, **strict)
        ) as gpt,
        run_in_thread(
            FakeUpstreamConfig(port=0, api_key=ANTHROPIC_KEY, rpm=ANTHROPIC_LIMIT, **strict)
        ) as claude,
        ExitStack() as stack,
    ):
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        config = _config(redis.url, gpt, claude)
        replicas = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )
        results = asyncio.run(_load([replica.base_url for replica in replicas]))
        served = {"openai": gpt.stats(), "anthropic": claude.stats()}
    failures = [r for r in results if isinstance(r, BaseException)]
    print(
        f"\nserved: openai {served['openai']['served']}, anthropic"
        f" {served['anthropic']['served']}; upstream 429s: openai"
        f" {served['openai']['rejected']}, anthropic {served['anthropic']['rejected']}"
    )
    assert failures == [], failures[:3]
    assert all(
        r in ("weather", "Lorem ipsum dolor sit amet, consectetur adipiscing elit,")
        for r in results
    )
    assert served["openai"]["rejected"] == 0 and served["anthropic"]["rejected"] == 0
    assert served["openai"]["served"] + served["anthropic"]["served"] == COUNT
    # The OpenAI upstream took what its window allows; the rest went translated.
    assert served["openai"]["served"] <= OPENAI_LIMIT
    assert served["anthropic"]["served"] >= COUNT - OPENAI_LIMIT
    assert served["anthropic"]["by_endpoint"] == {
        "POST /v1/messages": served["anthropic"]["requests"]
    }
