"""A request's journey without servers, for the pipeline's and the dispatcher's tests: the
memory limiter on an injected clock and a scripted upstream (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.keys.store import RuntimeKeys
from proxy.limiter.memory import MemoryLimiter
from proxy.observability.metrics import Metrics
from proxy.pipeline.pipeline import Pipeline
from proxy.request.call import Reply
from proxy.shapes.base import Shape
from proxy.shapes.chat import CHAT
from support.proxy_server import settings_from

KEY = "Bearer sk-client"
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
REQUEST = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Answer = Callable[[httpx.Request], httpx.Response]


class Upstream:
    """Answers each deployment (by host) as scripted, and records what it was sent."""

    def __init__(self, script: dict[str, Answer]) -> None:
        self.script = script
        self.sent: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.sent.append(host)
        return self.script[host](request)


def ok(usage: dict[str, int] | None = USAGE) -> Answer:
    body: dict[str, Any] = {"id": "x", "object": "chat.completion", "choices": []}
    if usage is not None:
        body["usage"] = usage
    return lambda _: httpx.Response(200, json=body)


def status(code: int) -> Answer:
    return lambda _: httpx.Response(code, json={"error": {"message": "no"}})


def deployment(name: str, **extra: object) -> dict[str, object]:
    return {"id": name, "base_url": f"http://{name}.test/v1", "api_key": "sk-up", **extra}


def config(
    deployments: list[dict[str, object]],
    key: dict[str, object] | None = None,
    **routing: object,
) -> dict[str, Any]:
    return {
        "keys": [{"name": "k", "key": "sk-client", **(key or {})}],
        "models": [{"name": "m", "deployments": deployments}],
        "routing": {"retries": 2, **routing},
    }


class Journey:
    """A pipeline over the memory limiter (its clock ``clock``) and ``upstream``."""

    def __init__(
        self,
        data: dict[str, Any],
        upstream: Upstream,
        limiter: type[MemoryLimiter] = MemoryLimiter,
        runtime_keys: RuntimeKeys | None = None,
    ) -> None:
        self.clock = Clock()
        self.upstream = upstream
        self.metrics = Metrics(budget_shared=False)
        self.pipeline = Pipeline(
            settings_from(data),
            limiter(self.clock),
            httpx.MockTransport(upstream),
            self.metrics,
            rng=random.Random(7),
            runtime_keys=runtime_keys,
        )

    async def send(
        self, body: dict[str, Any] = REQUEST, shape: Shape = CHAT, bearer: str = KEY
    ) -> Reply:
        key = self.pipeline.keys.authenticate(bearer)
        headers = [("content-type", "application/json"), ("authorization", bearer)]
        reply = await self.pipeline.handle(shape, orjson.dumps(body), headers, key)
        await asyncio.sleep(0)  # the answer's bookkeeping (one callback)
        await self.pipeline.drain()
        return reply

    def counted(self, name: str, **labels: str) -> float:
        text = self.metrics.render()[0].decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and labels.items() <= s.labels.items():
                    return s.value
        return 0.0
