"""docs/architecture.md's recipe for an API shape, followed in the test itself: a toy
shape whose model is in its URL (``/toy/v1/{model}/generate``), whose key comes only as a
query parameter (``?token=``) and whose output cap is nested (``options.limits.words``
on the client's side, sent upstream where the provider reads it), registered beside the
others and served through the real proxy, on the memory limiter and on a Redis the test
starts: answered, refused by its key's window in its own error shape, and paced under
its deployment's window with no 429 at the (strict) upstream.

Its upstream is a Gemini API deployment (the fake upstream's): the provider is told it
speaks the toy shape too (a provider's ``shapes``), as a provider module would say it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import RedisServer, redis_available

from proxy import shapes
from proxy.costs import Cost, TokenUsage, estimate_cost
from proxy.errors import InvalidRequest, ProxyError
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.limiter.base import KeyVerdict
from proxy.providers.gemini import GEMINI_SHAPES, Gemini
from proxy.shapes.base import AS_SENT, Prepared, RequestTarget, StreamUsage
from proxy.shapes.cache_prefixes import CachePrefixes
from proxy.shapes.gemini import GeminiStreamUsage, usage_of
from proxy.shapes.openai import key_headers
from proxy.shapes.output_caps import OutputCaps
from proxy.values import value

UPSTREAM_KEY = "toy-upstream-secret-0123456789"
TOKEN = "toy-client-token-0123456789"
LIMIT = 3  # the strict upstream's requests in any second, and its deployment's


@value
class QueryToken:
    """The key only as ``?token=``: no header carries it."""

    headers: tuple[str, ...] = ()
    query: tuple[str, ...] = ("token",)
    missing: str = "Missing token: add '?token=YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        return value or None


class Toy:
    """The recipe's step 1: a class following ``shapes.base.Shape``."""

    name = "toy/generate"
    paths = ("/toy/v1/{model}/generate",)
    credential = QueryToken()
    stores_responses = False
    # The cap where this API's upstream (the Gemini API) reads it: at depth two.
    output_caps = OutputCaps(
        sent=("generationConfig", "maxOutputTokens"),
        carriers=(("generationConfig", "maxOutputTokens"),),
    )

    def model_of(self, body: dict[str, Any], target: RequestTarget) -> object:
        return target.params.get("model")  # the URL's, never the body's

    def streamed(self, body: dict[str, Any], target: RequestTarget) -> bool:
        return False

    def check(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("contents"), list):
            raise InvalidRequest("'contents' must be an array.", param="contents")

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        config = body.get("generationConfig") or {}
        return estimate_cost(len(orjson.dumps(body)) / 4, config.get("maxOutputTokens") or 16)

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        return None

    def prepare(self, body: dict[str, Any], stream: bool) -> Prepared:
        return AS_SENT

    def usage(self, content: bytes) -> TokenUsage | None:
        return usage_of(orjson.loads(content).get("usageMetadata"))

    def stream_usage(self) -> StreamUsage:
        return GeminiStreamUsage()

    def error_body(self, error: ProxyError) -> bytes:
        return orjson.dumps({"toy_error": {"why": error.code, "text": error.message}})

    def stream_error(self, message: str) -> bytes:
        return b"data: " + orjson.dumps({"toy_error": message}) + b"\n\n"

    def key_headers(self, verdict: KeyVerdict, now: float) -> dict[str, str]:
        return key_headers(verdict, now)


TOY = Toy()
BODY = {"contents": [{"parts": [{"text": "hello toy"}]}], "generationConfig": {}}


@pytest.fixture(scope="module", params=["memory", "redis"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "memory":
        yield ""
        return
    if not redis_available():
        pytest.skip("redis-server is not installed")
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, rpm=LIMIT, window=1.0)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(redis_url: str, upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    deployment = {
        "id": "toy-upstream",
        "provider": "gemini",
        "base_url": upstream.url,
        "api_key": UPSTREAM_KEY,
        "model": "gemini-2.5-flash",
        "limits": [{"requests": LIMIT, "per": "1s"}],
    }
    config = {
        "redis": {"url": redis_url},
        "keys": [{"name": "toy-user", "key": TOKEN, "rpm": 2 * LIMIT + 2}],
        "models": [{"name": "toy-model", "deployments": [deployment]}],
        "routing": {"retries": 0, "max_wait": "10s"},
    }
    # Step 2, its registry line (here for this test only), and a provider speaking it.
    with pytest.MonkeyPatch.context() as patch, shapes.registered(TOY):
        patch.setattr(Gemini, "shapes", GEMINI_SHAPES | {TOY.name})
        with ProxyInThread(settings_from(config)) as server:
            yield server


def _url(proxy: ProxyInThread, token: str = TOKEN, model: str = "toy-model") -> str:
    return f"{proxy.url}/toy/v1/{model}/generate?token={token}"


def test_the_toy_shape_is_served_from_its_url(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.reset()
    reply = httpx.post(_url(proxy), json=BODY, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usageMetadata"]["promptTokenCount"] > 0
    seen = upstream.stats()["last_request"]
    assert seen["path"] == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert TOKEN not in repr(seen)  # the query's key is the proxy's, never forwarded
    # The key may use no other form, and errors take the toy's own shape.
    missing = httpx.post(f"{proxy.url}/toy/v1/toy-model/generate", json=BODY)
    assert missing.status_code == 401 and "toy_error" in missing.json()
    unknown = httpx.post(_url(proxy, model="nope"), json=BODY)
    assert unknown.status_code == 404 and unknown.json()["toy_error"]["why"]


@pytest.mark.slow
def test_the_toy_shape_is_paced_under_its_deployment_s_window(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.reset()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=15) as client:
            replies = await asyncio.gather(
                *(client.post(_url(proxy), json=BODY) for _ in range(2 * LIMIT))
            )
        return [r.status_code for r in replies]

    assert asyncio.run(burst()) == [200] * (2 * LIMIT)
    assert upstream.stats()["rejected"] == 0  # paced: the strict upstream refused nothing


@pytest.mark.slow
def test_the_toy_shape_is_limited_by_its_key(proxy: ProxyInThread) -> None:
    statuses = [httpx.post(_url(proxy), json=BODY, timeout=15) for _ in range(2 * LIMIT + 2)]
    refused = [r for r in statuses if r.status_code == 429]
    assert refused, [r.status_code for r in statuses]
    body = refused[0].json()
    assert body["toy_error"]["why"] == "key_rpm"
    assert "retry-after" in refused[0].headers
    assert refused[0].headers["x-ratelimit-limit-requests"] == str(2 * LIMIT + 2)
