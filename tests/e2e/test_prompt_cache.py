"""A team that caches its prompts gets the capacity Anthropic gives it: the Anthropic SDK
sends a prompt-cached workload (a long system prompt marked ``cache_control``, a short
question each time) through a proxy process, over HTTP on 127.0.0.1, to a fake Anthropic
upstream with a prompt cache and a strict sliding window of input tokens that, as
Anthropic's, counts uncached input and cache writes but not cache reads. The deployment
states the same limit. Demand is far above it.

Each request reads about a thousand tokens from the cache and is counted 13: charged its
whole input, the proxy would send one request where the upstream takes seventy. The proxy
leaves out of its estimate what the deployment's answers showed cached, and settles each
request to what Anthropic counts: the upstream must reject nothing and its input window
must be used to at least 95%, counted in the tokens it admitted (not timed).

Two replicas sharing a real Redis (each replica learns the cache from its own answers);
one process on the in-memory limiter settles by the same rule (the pure cores the Lua is
proven equal to: tests/limiter/test_limiter_equivalence.py; what Anthropic counts:
tests/providers/test_counting.py). The figure each run measures is printed (``-s``
shows it); docs/benchmarks.md ("Limiter accuracy") records it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread

pytestmark = pytest.mark.slow  # bounded load for many seconds: `make test-fast` skips it

UPSTREAM_KEY = "sk-ant-upstream"
CLIENT_KEY = "sk-client-cached"
WINDOW = 10.0  # the upstream's strict sliding window, seconds
INPUT_LIMIT = 3000  # input tokens it counts in any window: 300 a second
PER_SECOND = INPUT_LIMIT / WINDOW
# Seconds of load: the upstream's 10 s window fills and slides; the figure is a rate over
# the span the upstream admitted requests, so it does not grow with the run's length.
DURATION = 10.0
WORKERS = 24  # clients in a closed loop: far more than the window admits
# About a thousand tokens read from the cache by every request after the first (the
# fake counts a prefix as its characters / 4 and 3 per message, 3 per request).
SYSTEM = [
    {
        "type": "text",
        "text": "You answer questions about the proxy's accounting. " * 80,
        "cache_control": {"type": "ephemeral"},
    }
]


def _question(n: int) -> list[dict[str, Any]]:
    # 40 characters: 10 tokens, 13 with its message, all that is counted after the first.
    return [{"role": "user", "content": f"Question {n:06d}: what does it count?!"}]


async def _load(urls: list[str], seconds: float) -> Counter[str]:
    """``WORKERS`` clients asking in a closed loop for ``seconds``, spread over the
    proxies at ``urls``: their outcomes."""
    clients = [
        anthropic.AsyncAnthropic(base_url=url, api_key=CLIENT_KEY, max_retries=0) for url in urls
    ]
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    numbers = iter(range(1_000, 1_000_000))

    async def worker(client: anthropic.AsyncAnthropic) -> None:
        while time.monotonic() < deadline:
            try:
                message = await client.messages.create(
                    model="claude",
                    max_tokens=20,
                    system=SYSTEM,  # type: ignore[arg-type]
                    messages=_question(next(numbers)),  # type: ignore[arg-type]
                )
            except anthropic.APIStatusError as error:
                outcomes[str(error.status_code)] += 1
            else:
                outcomes["200"] += 1
                outcomes["cache_read"] += message.usage.cache_read_input_tokens or 0

    try:
        await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(WORKERS)))
    finally:
        for client in clients:
            await client.close()
    return outcomes


@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")
def test_a_prompt_cached_workload_uses_anthropics_input_window(tmp_path: Path) -> None:
    replicas = 2
    upstream_config = FakeUpstreamConfig(
        port=0,
        itpm=INPUT_LIMIT,
        window=WINDOW,
        latency=0.02,
        api_key=UPSTREAM_KEY,
        prompt_cache=True,
    )
    with run_in_thread(upstream_config) as upstream, ExitStack() as stack:
        config: dict[str, Any] = {
            "keys": [{"name": "team", "key": CLIENT_KEY}],
            "models": [
                {
                    "name": "claude",
                    "deployments": [
                        {
                            "id": "anthropic",
                            "provider": "anthropic",
                            "base_url": upstream.url,
                            "api_key": UPSTREAM_KEY,
                            "timeout": "10s",
                            # The upstream's limit as Anthropic states it: per minute.
                            "limits": [{"input_tokens": round(PER_SECOND * 60), "per": "1m"}],
                        }
                    ],
                }
            ],
            # Replicas on a quiet loop: a fixed margin of 10 ms for late turns (50 ms, where
            # `auto` starts, paces any limit at 95.2%: docs/limiter.md, "Late turns").
            "routing": {"max_wait": "10s", "retries": 0, "pacing_margin": "10ms"},
        }
        config["redis"] = {"url": stack.enter_context(RedisServer(tmp_path / "redis")).url}
        proxies = start_together(
            stack,
            [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(replicas)],
        )
        # The cache written once, and each replica taught by an answer of its own that
        # shows it; then the upstream's window and counters start afresh (its cache stays).
        for n, proxy in enumerate(proxies):
            client = anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)
            warm = client.messages.create(
                model="claude",
                max_tokens=20,
                system=SYSTEM,  # type: ignore[arg-type]
                messages=_question(n),  # type: ignore[arg-type]
            )
            cached = warm.usage.cache_creation_input_tokens or warm.usage.cache_read_input_tokens
            assert cached, warm.usage
        upstream.reset()
        outcomes = asyncio.run(_load([p.url for p in proxies], DURATION))
        stats = upstream.stats()
    served = stats["served"]
    counted = stats["input_tokens_admitted"]
    first = counted / served if served else 0  # every request is counted alike here
    # Input tokens admitted after the first, over the span between the first admission
    # and the last (the queue drains past the load's end).
    used = (counted - first) / (PER_SECOND * stats["admitted_span"])
    print(
        f"\ninput window: {used:.1%} of it used over {stats['admitted_span']:.1f} s"
        f" ({counted} tokens counted, {stats['cache_read_tokens_admitted']} read from the"
        f" cache, {served} requests); upstream 429s {stats['rejected']};"
        f" clients: {dict(outcomes)}"
    )
    assert stats["rejected"] == 0, stats
    assert set(outcomes) <= {"200", "cache_read"}, outcomes
    assert outcomes["200"] == served
    assert stats["cache_read_tokens_admitted"] >= 1000 * served  # a cached workload
    assert used >= 0.95, stats
