"""docs/architecture.md's recipe for a provider, followed in the test itself: a toy
provider whose requests are signed (an HMAC of the method, path and body in a header,
made by its ``Wire`` over the final request) is registered (``providers.register``) and
named in a config, and the proxy serves the openai SDK through it and paces it to its
upstream's strict window, on the in-memory limiter and on Redis. The upstream checks
every signature: a wrong one is refused, so a request served was signed."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation
from support.scripted_upstream import ScriptedUpstream

from proxy import providers
from proxy.config.settings import PROVIDER_NAMES, Deployment
from proxy.costs import Counting
from proxy.limiter.base import Outcome
from proxy.providers.base import Wire
from proxy.providers.ratelimits import UpstreamBudget, parse_budget
from proxy.upstream.encoding import Reframer

SECRET = "toy-signing-secret-0123456789"
SIGNATURE = "x-toy-signature"
WINDOW, LIMIT = 2.0, 4  # the upstream takes 4 requests in any 2 s, strictly
CHAT: dict[str, Any] = {"model": "toy", "messages": [{"role": "user", "content": "hi"}]}


def sign(secret: str, method: str, path: str, body: bytes) -> str:
    message = method.encode() + b" " + path.encode() + b"\n" + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


# --- the recipe: one class following providers.base.Provider, one Wire ----------------


class SigningWire:
    """The toy's requests: the shape's JSON at its URL, signed over the final bytes."""

    stream_type = "text/event-stream"

    def __init__(self, url: str, secret: str) -> None:
        self._url, self._secret = url, secret

    def outgoing(
        self, shape: str, model: str | None, stream: bool, payload: bytes
    ) -> tuple[str, bytes]:
        return self._url, payload

    async def authorize(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        headers[SIGNATURE] = sign(self._secret, method, httpx.URL(url).path, body)

    def reframer(self) -> Reframer | None:
        return None  # it streams server-sent events


class ToySigned:
    name = "toy-signed"
    shapes = frozenset(("chat/completions",))
    # How the toy's limit counts: as OpenAI's, https://platform.openai.com/docs/guides/rate-limits
    counting = Counting(cache_reads=True, adjusted=False)
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        return f"{deployment.base_url}/v1/{shape}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        return None  # its wire signs

    def wire(self, deployment: Deployment) -> Wire | None:
        url = self.url(deployment, "chat/completions")
        return SigningWire(url, deployment.api_key.get_secret_value())

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return parse_budget(headers, now)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        return None


TOY = ToySigned()


@pytest.fixture
def toy() -> Iterator[ToySigned]:
    providers.register(TOY)
    try:
        yield TOY
    finally:  # registered for this test only
        providers.PROVIDERS.pop(TOY.name, None)
        PROVIDER_NAMES.remove(TOY.name)


# --- the upstream: checks each signature, keeps a strict sliding window ---------------


class SignedUpstream:
    def __init__(self) -> None:
        self.admitted: list[float] = []
        self.served = self.rejected = self.unsigned = 0

    async def answer(self, conversation: Conversation) -> None:
        request = conversation.request
        method, path, _ = request.request_line.split(" ", 2)
        expected = sign(SECRET, method, path, request.body)
        if not hmac.compare_digest(request.headers.get(SIGNATURE, ""), expected):
            self.unsigned += 1
            await _send(conversation, 401, {"error": {"message": "bad signature"}})
            return
        now = time.monotonic()
        self.admitted = [t for t in self.admitted if now - t < WINDOW]
        if len(self.admitted) >= LIMIT:
            self.rejected += 1
            await _send(conversation, 429, {"error": {"message": "rate limited"}})
            return
        self.admitted.append(now)
        self.served += 1
        await _send(conversation, 200, _completion())


def _completion() -> dict[str, Any]:
    return {
        "id": "chatcmpl-toy",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "toy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "signed"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


async def _send(conversation: Conversation, status: int, body: dict[str, Any]) -> None:
    data = orjson.dumps(body)
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    )
    await conversation.send(head.encode() + data)


# --- served and limited, on memory and Redis ------------------------------------------


def _config(url: str, limiter_url: str, secret: str = SECRET) -> dict[str, Any]:
    deployment = {
        "id": "toy",
        "provider": "toy-signed",
        "base_url": url,
        "api_key": secret,
        "rpm": round(LIMIT / WINDOW * 60),
    }
    return {
        "models": [{"name": "toy", "deployments": [deployment]}],
        "routing": {"retries": 0, "max_wait": "10s"},
        "redis": {"url": limiter_url},  # "": the in-memory limiter
    }


def test_a_registered_signing_provider_is_served_and_paced(
    toy: ToySigned, limiter_url: str
) -> None:
    upstream = SignedUpstream()
    with (
        ScriptedUpstream(upstream.answer) as server,
        ProxyInThread(settings_from(_config(server.url, limiter_url))) as proxy,
    ):
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)

        async def burst() -> list[str | None]:
            answers = await asyncio.gather(
                *(client.chat.completions.create(**CHAT) for _ in range(2 * LIMIT))
            )
            return [a.choices[0].message.content for a in answers]

        contents = asyncio.run(burst())
    assert contents == ["signed"] * 2 * LIMIT
    assert (upstream.served, upstream.rejected, upstream.unsigned) == (2 * LIMIT, 0, 0)


def test_the_upstream_refuses_a_wrong_signature(toy: ToySigned) -> None:
    upstream = SignedUpstream()
    config = _config("", "", secret="not-" + SECRET)
    with ScriptedUpstream(upstream.answer) as server:
        config["models"][0]["deployments"][0]["base_url"] = server.url
        with ProxyInThread(settings_from(config)) as proxy:
            answer = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_auth_error"
    assert upstream.unsigned == 1 and upstream.served == 0
