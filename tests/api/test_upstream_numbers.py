"""What a lying upstream can do through the real proxy: nothing lasting. A scripted
upstream on loopback sends non-finite and absurd numbers in its rate-limit headers, a
1-token announced limit, a 400 for a huge request; the proxy (in-memory limiter, and
Redis, where the state is shared) holds a deployment at most ``server.max_upstream_hold``,
keeps pacing above a floor, returns the token charge of what the upstream did not admit,
charges no usage beyond what one request can take, and its admin views never fail. A
daily limit of 5 admits 5."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.raw_upstream import Conversation, RawUpstream
from support.scripted_upstream import ScriptedUpstream
from support.waiting import wait_until

from proxy.catalog.catalog import pacing_headroom
from proxy.catalog.pacing import MAX_MARGIN

KEY = "sk-numbers"
OTHER_KEY = "sk-other"
ADMIN_KEY = "admin-numbers"
HOLD = 0.3  # server.max_upstream_hold of these tests, seconds (each lie waits it out)
MAX_WAIT = 5.0  # longer than HOLD, far shorter than any lie


def _completion(prompt_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1},
        }
    )


COMPLETION = _completion(5)
TOO_LARGE = orjson.dumps(
    {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
)


def _reply(status: int, reason: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head += f"content-length: {len(body)}\r\n\r\n"
    return head.encode() + body


Script = Callable[[int, dict[str, Any]], tuple[int, dict[str, str]]]


def _upstream(script: Script, completion: bytes = COMPLETION) -> RawUpstream:
    """Answers the n-th request (0, 1, ...) as ``script(n, body)`` says: a status and the
    headers to send with it (``completion`` for a 200, an OpenAI error otherwise)."""

    async def answer(conversation: Conversation) -> None:
        n = len(upstream.requests) - 1
        status, headers = script(n, orjson.loads(conversation.request.body))
        if status == 200:
            await conversation.send(_reply(200, "OK", completion, headers))
        else:
            await conversation.send(_reply(status, "Error", TOO_LARGE, headers))

    upstream = RawUpstream(answer)
    return upstream


def _config(
    upstream_url: str,
    redis_url: str,
    deployment: dict[str, Any] | None = None,
    key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "server": {"max_upstream_hold": f"{HOLD * 1000:g}ms"},
        "admin": {"keys": [ADMIN_KEY]},
        "keys": [{"name": "k", "key": KEY, **(key or {})}, {"name": "other", "key": OTHER_KEY}],
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "d", "base_url": f"{upstream_url}/v1", **(deployment or {"rpm": 600})}
                ],
            }
        ],
        "routing": {"retries": 0, "max_wait": f"{MAX_WAIT}s"},
    }


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> str:
    """The limiter's storage: "" (in memory), or the session's Redis (state shared)."""
    if request.param == "memory":
        return ""
    url: str = request.getfixturevalue("redis_url")
    return url


def _chat(max_tokens: int = 5) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


async def _with_proxy(
    upstream: RawUpstream,
    redis_url: str,
    deployment: dict[str, Any] | None,
    scenario: Callable[[ProxyInThread, httpx.AsyncClient], Awaitable[None]],
    key: dict[str, Any] | None = None,
) -> None:
    async with upstream:
        config = _config(upstream.url, redis_url, deployment, key)
        proxy = ProxyInThread(settings_from(config))
        await asyncio.to_thread(proxy.start)
        try:
            async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
                await scenario(proxy, client)
        finally:
            await asyncio.to_thread(proxy.stop)


def _post(client: httpx.AsyncClient, body: dict[str, Any], key: str = KEY) -> Any:
    return client.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )


async def _admin_views_answer(client: httpx.AsyncClient) -> dict[str, Any]:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    page = await client.get("/admin", headers=admin)
    assert page.status_code == 200, page.text
    state = await client.get("/admin/state", headers=admin)
    assert state.status_code == 200, state.text
    view: dict[str, Any] = state.json()
    return view


LIES = [
    pytest.param({"retry-after": "inf"}, id="retry-after-inf"),
    pytest.param({"retry-after": "nan"}, id="retry-after-nan"),
    pytest.param({"retry-after": "1e12"}, id="retry-after-1e12"),
    pytest.param({"retry-after": "86400"}, id="retry-after-a-day"),
    pytest.param({"retry-after-ms": "1e30"}, id="retry-after-ms-1e30"),
    pytest.param({"retry-after-ms": "inf", "retry-after": "1e12"}, id="retry-after-ms-inf"),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "inf"},
        id="reset-requests-inf",
    ),
    pytest.param(
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1e12"},
        id="reset-tokens-1e12",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999999h0m0s"},
        id="reset-requests-go-duration-of-centuries",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("lie", LIES)
def test_a_429_holds_a_deployment_at_most_max_upstream_hold(
    storage: str, lie: dict[str, str]
) -> None:
    """The first answer is a 429 whose headers lie; its request waits out the hold, cut
    to max_upstream_hold (0.3 s, within its max_wait of 5 s: a hold as long as the lie would
    have been a 503), and is served; the admin views still answer, and the next request
    is served too."""
    upstream = _upstream(lambda n, body: (429, lie) if n == 0 else (200, {}))

    async def scenario(proxy: ProxyInThread, client: httpx.AsyncClient) -> None:
        waited = await _post(client, _chat())
        assert waited.status_code == 200, waited.text
        assert "x-llm-proxy-queue-ms" in waited.headers  # it waited for its new turn
        assert waited.headers["x-request-id"]
        await asyncio.to_thread(proxy.settled)
        view = await _admin_views_answer(client)
        hold = view["models"][0]["deployments"][0]["health"]["hold_until"]
        assert hold is None or hold["in"] <= HOLD, hold
        served = await _post(client, _chat())
        assert served.status_code == 200, served.text
        await _admin_views_answer(client)

    asyncio.run(_with_proxy(upstream, storage, None, scenario))
    assert len(upstream.requests) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "announced",
    [
        pytest.param(
            {"x-ratelimit-limit-tokens": "1", "x-ratelimit-remaining-tokens": "1"}, id="tokens"
        ),
        pytest.param(
            {"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "1"},
            id="requests",
        ),
    ],
)
def test_an_absurd_announced_limit_never_refuses_what_the_configured_one_admits(
    storage: str, announced: dict[str, str]
) -> None:
    """One answer announces a limit of 1: the requests after it,
    each well within the configured limits (600 rpm, 100,000 tpm; one of 50,000 tokens),
    are still served, paced at no less than the floor (a tenth of what is configured)."""
    upstream = _upstream(lambda n, body: (200, announced) if n == 0 else (200, {}))

    async def scenario(proxy: ProxyInThread, client: httpx.AsyncClient) -> None:
        first = await _post(client, _chat())
        assert first.status_code == 200, first.text
        await asyncio.to_thread(proxy.settled)
        for max_tokens in (5, 5, 50_000):
            later = await _post(client, _chat(max_tokens))
            assert later.status_code == 200, later.text
        await _admin_views_answer(client)

    deployment = {"rpm": 600, "tpm": 100_000}
    asyncio.run(_with_proxy(upstream, storage, deployment, scenario))
    assert len(upstream.requests) == 4


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_an_answer_that_did_not_admit_the_request_returns_its_token_charge(
    storage: str, status: int
) -> None:
    """One key's request of 98,000 tokens on a deployment of 100,000 a minute, which the
    upstream refuses: another key's request right after goes at once, not in about 56 s
    (the refused request's tokens were given back)."""
    upstream = _upstream(lambda n, body: (status, {}) if body["max_tokens"] > 1000 else (200, {}))

    async def scenario(proxy: ProxyInThread, client: httpx.AsyncClient) -> None:
        refused = await _post(client, _chat(98_000))
        assert refused.status_code == status, refused.text
        await asyncio.to_thread(proxy.settled)
        background = proxy.app.state.pipeline.background
        await asyncio.to_thread(wait_until, lambda: not background._tasks, 5.0, "settled")
        served = await _post(client, _chat(), key=OTHER_KEY)
        assert served.status_code == 200, served.text
        assert float(served.headers.get("x-llm-proxy-queue-ms", "0")) < 1000

    asyncio.run(_with_proxy(upstream, storage, {"tpm": 100_000}, scenario))
    assert len(upstream.requests) == 2


def test_a_deployment_limit_of_5_a_day_admits_5(storage: str) -> None:
    """The pacing headroom (1%) never costs a long window a whole request: five requests
    in a row on ``rpd: 5`` are all served; the sixth is refused at once."""
    upstream = _upstream(lambda n, body: (200, {}))

    async def scenario(proxy: ProxyInThread, client: httpx.AsyncClient) -> None:
        for _ in range(5):
            served = await _post(client, _chat())
            assert served.status_code == 200, served.text
        refused = await _post(client, _chat())
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "model_capacity"

    asyncio.run(_with_proxy(upstream, storage, {"rpd": 5}, scenario))
    assert len(upstream.requests) == 5


def test_a_usage_no_request_could_have_used_is_charged_at_most_one_requests_worth(
    storage: str,
) -> None:
    """An answer that says its request used 10**18 tokens, on a deployment and a key of
    100,000 a minute: each is charged at most what one request can take there (their
    token windows are full again within a minute, not in millennia)."""
    upstream = _upstream(lambda n, body: (200, {}), completion=_completion(10**18))

    async def scenario(proxy: ProxyInThread, client: httpx.AsyncClient) -> None:
        served = await _post(client, _chat())
        assert served.status_code == 200, served.text
        await asyncio.to_thread(proxy.settled)
        background = proxy.app.state.pipeline.background
        await asyncio.to_thread(wait_until, lambda: not background._tasks, 5.0, "settled")
        view = await _admin_views_answer(client)
        [tpm] = view["models"][0]["deployments"][0]["windows"]
        # A minute's allowance, refilled at the paced rate (routing.pacing_margin: auto,
        # at most MAX_MARGIN).
        paced_minute = 60.0 / (1.0 - pacing_headroom(MAX_MARGIN))
        assert tpm["name"] == "tpm" and tpm["full_in"]["in"] <= paced_minute + 1.0, tpm
        [key_tpm] = next(k for k in view["keys"] if k["name"] == "k")["windows"]
        assert key_tpm["name"] == "tpm" and key_tpm["full_in"]["in"] <= 61.0, key_tpm

    asyncio.run(_with_proxy(upstream, storage, {"tpm": 100_000}, scenario, key={"tpm": 100_000}))


# -- usage counts that are no counts ----------------------------------------------------

# A usage count as the upstream writes it: none of these is a count of a request's tokens.
USAGE_LIES = {
    "beyond-64-bits": b"18446744073709551617",
    "negative-beyond-64-bits": b"-18446744073709551617",
    "negative": b"-5",
    "infinite": b"1e400",
    "fraction": b"12.5",
    "string": b'"12"',
    "boolean": b"true",
}
USAGE_CASES = [(lie, field) for lie in USAGE_LIES for field in ("prompt", "completion")]
LIAR_MAX_TOKENS = 1000
LIAR_WINDOW = 1_000_000  # tokens a key may use in 30 days: what refills in a test is < 1


def _usage(case: str) -> bytes:
    lie, field = case.split(":")
    counts = {"prompt": b"7", "completion": b"3"}
    counts[field] = USAGE_LIES[lie]
    return b'{"prompt_tokens":%s,"completion_tokens":%s}' % (counts["prompt"], counts["completion"])


async def _liar(conversation: Conversation) -> None:
    """A chat upstream whose usage says what the request's last message names."""
    body = orjson.loads(conversation.request.body)
    usage = _usage(body["messages"][-1]["content"])
    if body.get("stream") is not True:
        message = b'{"role":"assistant","content":"ok"}'
        choice = b'{"index":0,"message":%s,"finish_reason":"stop"}' % message
        head = b'{"id":"c","object":"chat.completion","created":1,"model":"m",'
        await conversation.send(
            _reply(200, "OK", head + b'"choices":[%s],"usage":%s}' % (choice, usage), {})
        )
        return
    chunk = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
    delta = chunk + b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}'
    last = chunk + b'"choices":[],"usage":%s}' % usage
    events = b"".join(b"data: %s\n\n" % e for e in (delta, last, b"[DONE]"))
    sse = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(events)}"
    await conversation.send(sse.encode() + b"\r\n\r\n" + events)


@pytest.fixture(scope="module")
def liar_proxy() -> Iterator[ProxyInThread]:
    """One key per case (its window counts that case's charge alone)."""
    with ScriptedUpstream(_liar) as upstream:
        window = [{"tokens": LIAR_WINDOW, "per": "30d"}]
        keys = [
            {"name": f"{lie}:{field}:{way}", "key": f"sk-{lie}-{field}-{way}", "limits": window}
            for lie, field in USAGE_CASES
            for way in ("plain", "stream")
        ]
        config = {
            "admin": {"keys": [ADMIN_KEY]},
            "keys": keys,
            "models": [
                {"name": "m", "deployments": [{"id": "d", "base_url": f"{upstream.url}/v1"}]}
            ],
            "routing": {"retries": 0},
        }
        with ProxyInThread(settings_from(config)) as server:
            yield server


@pytest.mark.parametrize("way", ["plain", "stream"])
@pytest.mark.parametrize(("lie", "field"), USAGE_CASES)
def test_a_usage_count_that_is_no_count_is_never_charged_as_0(
    liar_proxy: ProxyInThread, lie: str, field: str, way: str
) -> None:
    """A count beyond 64 bits (orjson reads it as a float), negative, infinite, a
    fraction, a string or a boolean, plain or streamed: the answer is served and
    the key is charged at least the request's estimate (at least its 1,000 tokens of
    output cap): an absurd count clamped, one that is none read as no usage, never as
    0 tokens."""
    client = openai.OpenAI(
        base_url=liar_proxy.base_url, api_key=f"sk-{lie}-{field}-{way}", max_retries=0
    )
    messages: Any = [{"role": "user", "content": f"{lie}:{field}"}]
    if way == "plain":
        done = client.chat.completions.create(
            model="m", messages=messages, max_tokens=LIAR_MAX_TOKENS
        )
        assert done.choices[0].message.content == "ok"
    else:
        stream = client.chat.completions.create(
            model="m", messages=messages, max_tokens=LIAR_MAX_TOKENS, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "ok"
    liar_proxy.settled()
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    state = httpx.get(f"{liar_proxy.url}/admin/state", headers=admin, timeout=10).json()
    [window] = next(k for k in state["keys"] if k["name"] == f"{lie}:{field}:{way}")["windows"]
    charged = LIAR_WINDOW - window["remaining"]
    assert charged >= LIAR_MAX_TOKENS, (lie, field, way, charged)


# -- usage counts beyond 64 bits in the Responses and Messages APIs ----------------------

BEYOND_64_BITS = b"18446744073709551617"  # 2**64 + 1: orjson reads it as a float
API_CASES = ["responses:input_tokens", "messages:input_tokens", "messages:cache_creation"]


async def _api_liar(conversation: Conversation) -> None:
    """A Responses and a Messages upstream whose usage says 2**64 + 1 where the request's
    text names it (``input_tokens``, or Anthropic's ``cache_creation_input_tokens``)."""
    body = orjson.loads(conversation.request.body)
    if conversation.request.request_line.split()[1].endswith("/responses"):
        usage = b'{"input_tokens":%s,"output_tokens":3,"total_tokens":3}' % BEYOND_64_BITS
        text = b'{"type":"output_text","text":"ok","annotations":[]}'
        item = b'{"type":"message","id":"m","status":"completed","role":"assistant","content":[%s]}'
        head = b'{"id":"resp_1","object":"response","created_at":1,"model":"m","status":"completed"'
        answer = head + b',"output":[%s],"usage":%s}' % (item % text, usage)
    else:
        lie = body["messages"][-1]["content"].split(":")[1]
        counts = {"input_tokens": b"7", "cache_creation": b"0"}
        counts[lie] = BEYOND_64_BITS
        usage = b'{"input_tokens":%s,"cache_creation_input_tokens":%s,"output_tokens":3}' % (
            counts["input_tokens"],
            counts["cache_creation"],
        )
        head = b'{"id":"msg_1","type":"message","role":"assistant","model":"claude"'
        answer = head + b',"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"'
        answer += b',"stop_sequence":null,"usage":%s}' % usage
    await conversation.send(_reply(200, "OK", answer, {}))


@pytest.mark.parametrize("case", API_CASES)
def test_a_usage_count_beyond_64_bits_is_never_charged_as_0_in_every_api(case: str) -> None:
    """Issue 51: a count past 64 bits was read as a float and dropped (the input counted
    0). In the Responses and the Messages API, through the official SDKs: served, and the
    key charged at least its request's output cap, never the 3 tokens of output alone."""
    with ScriptedUpstream(_api_liar) as upstream:
        config = {
            "admin": {"keys": [ADMIN_KEY]},
            "keys": [{"name": "k", "key": KEY, "limits": [{"tokens": LIAR_WINDOW, "per": "30d"}]}],
            "models": [
                {"name": "m", "deployments": [{"id": "d", "base_url": f"{upstream.url}/v1"}]},
                {
                    "name": "claude",
                    "deployments": [{"id": "a", "provider": "anthropic", "base_url": upstream.url}],
                },
            ],
            "routing": {"retries": 0},
        }
        with ProxyInThread(settings_from(config)) as proxy:
            if case.startswith("responses"):
                client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
                done = client.responses.create(
                    model="m", input=case, max_output_tokens=LIAR_MAX_TOKENS
                )
                assert done.output_text == "ok"
            else:
                claude = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
                message = claude.messages.create(
                    model="claude",
                    max_tokens=LIAR_MAX_TOKENS,
                    messages=[{"role": "user", "content": case}],
                )
                assert message.content[0].type == "text" and message.content[0].text == "ok"
            proxy.settled()
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            state = httpx.get(f"{proxy.url}/admin/state", headers=admin, timeout=10).json()
    [window] = state["keys"][0]["windows"]
    charged = LIAR_WINDOW - window["remaining"]
    assert charged >= LIAR_MAX_TOKENS, (case, charged)
