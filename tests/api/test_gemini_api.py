"""The Gemini API as a user sees it: Google's official ``google-genai`` SDK (and a raw
client for ``?key=``) against a real proxy in front of the fake upstream's Gemini API,
over HTTP on 127.0.0.1, on the memory limiter and on a Redis the test starts. Served,
streamed, limited by the key's and by the deployment's windows (a strict upstream that
sees no 429 while the proxy paces), its 429 ``RetryInfo`` learned, Google-shaped errors,
and no credential (the upstream's, a client's header or ``?key=``) in any log line,
error body, metric or admin state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

UPSTREAM_KEY = "AIza-upstream-secret-0123456789"
CLIENT = "gk-client-gemini-0123456789"
LIMITED = "gk-client-limited-0123456789"
QUERY_KEY = "gk-client-in-query-0123456789"
IMPATIENT = "gk-client-impatient-0123456789"
BUDGETED = "gk-client-budgeted-0123456789"
ADMIN_KEY = "gk-admin-secret-0123456789"
SECRETS = (UPSTREAM_KEY, CLIENT, LIMITED, QUERY_KEY, IMPATIENT, BUDGETED, ADMIN_KEY)
MODEL = "gemini-2.5-flash"
PATH = f"/v1beta/models/{MODEL}:generateContent"
BODY = {"contents": [{"role": "user", "parts": [{"text": "Hello there, fake!"}]}]}
# The strict upstream behind "paced": this many requests in any window of this many s.
STRICT_LIMIT = 6
STRICT_WINDOW = 2.0
# The one behind "liar" (its deployment says 600 a minute): 2 in any 30 s.
LIAR_LIMIT = 2
LIAR_WINDOW = 30.0


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
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(scope="module")
def strict() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(
        port=0, api_key=UPSTREAM_KEY, rpm=STRICT_LIMIT, window=STRICT_WINDOW, latency=0.02
    )
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(scope="module")
def liar() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, rpm=LIAR_LIMIT, window=LIAR_WINDOW)
    with run_in_thread(config) as handle:
        yield handle


def _deployment(name: str, upstream: FakeUpstreamHandle, **fields: Any) -> dict[str, Any]:
    deployment = {"id": name, "provider": "gemini", "base_url": upstream.url}
    return {"name": name, "deployments": [{**deployment, "api_key": UPSTREAM_KEY, **fields}]}


@pytest.fixture(scope="module")
def proxy(
    redis_url: str,
    upstream: FakeUpstreamHandle,
    strict: FakeUpstreamHandle,
    liar: FakeUpstreamHandle,
) -> Iterator[ProxyInThread]:
    config = {
        "redis": {"url": redis_url},
        "admin": {"keys": [ADMIN_KEY]},
        "keys": [
            {"name": "app", "key": CLIENT, "limits": [{"tokens": 1_000_000, "per": "1d"}]},
            {"name": "by-query", "key": QUERY_KEY},
            {"name": "limited", "key": LIMITED, "rpm": 2},
            {"name": "impatient", "key": IMPATIENT, "max_wait": "100ms"},
            {
                "name": "budgeted",
                "key": BUDGETED,
                "budgets": [{"tokens": 1_000_000, "period": "day"}],
            },
        ],
        "models": [
            _deployment(MODEL, upstream),
            _deployment("paced", strict, limits=[{"requests": STRICT_LIMIT, "per": "2s"}]),
            _deployment("liar", liar, rpm=600),
        ],
        "routing": {
            "retries": 0,
            "max_wait": "10s",
            "cooldown": {"allowed_fails": 1, "window": "60s", "time": "1s"},
        },
    }
    with ProxyInThread(settings_from(config)) as server:
        yield server


def _client(proxy: ProxyInThread, key: str = CLIENT) -> genai.Client:
    options = types.HttpOptions(base_url=proxy.url, timeout=15_000)
    return genai.Client(api_key=key, http_options=options)


def _capped(tokens: int) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(max_output_tokens=tokens)


@pytest.mark.slow
def test_a_plain_answer_through_the_sdk(proxy: ProxyInThread, upstream: FakeUpstreamHandle) -> None:
    client = _client(proxy)  # (kept: a client collected closes its connections)
    answer = client.models.generate_content(model=MODEL, contents="Hello there", config=_capped(12))
    assert answer.text
    usage = answer.usage_metadata
    assert usage is not None and usage.candidates_token_count == 12  # the cap, as sent
    seen = upstream.stats()["last_request"]
    assert seen["path"] == PATH
    assert seen["headers"]["x-goog-api-key"] == UPSTREAM_KEY  # the deployment's, not CLIENT's
    assert seen["body"]["generationConfig"] == {"maxOutputTokens": 12}


def test_a_stream_through_the_sdk(proxy: ProxyInThread, upstream: FakeUpstreamHandle) -> None:
    client = _client(proxy)
    chunks = list(
        client.models.generate_content_stream(
            model=MODEL, contents="Stream to me", config=_capped(16)
        )
    )
    assert len(chunks) > 1
    assert "".join(c.text or "" for c in chunks)
    last = chunks[-1].usage_metadata
    assert last is not None and last.candidates_token_count == 16
    seen = upstream.stats()["last_request"]
    assert seen["path"] == f"/v1beta/models/{MODEL}:streamGenerateContent"


def test_a_request_without_a_cap_is_sent_with_the_one_it_was_reserved_for(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    client = _client(proxy, BUDGETED)  # (a budget reserves the cap it is sent with)
    client.models.generate_content(model=MODEL, contents="no cap")
    config = upstream.stats()["last_request"]["body"]["generationConfig"]
    assert config["maxOutputTokens"] > 0  # server.default_max_tokens, nested where it goes


def test_the_key_in_the_query_is_taken_and_never_forwarded(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    reply = httpx.post(f"{proxy.url}{PATH}?key={QUERY_KEY}", json=BODY, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usageMetadata"]["promptTokenCount"] > 0
    seen = upstream.stats()["last_request"]
    assert QUERY_KEY not in repr(seen)
    streamed = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key={QUERY_KEY}",
        json=BODY,
        timeout=10,
    )
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert b"\r\n" not in streamed.content  # Google's CRLF events, as LF ones
    assert streamed.text.count("data: ") > 1


@pytest.mark.slow
def test_errors_take_google_s_shape(proxy: ProxyInThread) -> None:
    wrong = httpx.post(f"{proxy.url}{PATH}", json=BODY, headers={"x-goog-api-key": "nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["status"] == "UNAUTHENTICATED"
    missing = httpx.post(f"{proxy.url}{PATH}", json=BODY)
    assert missing.status_code == 401 and "x-goog-api-key" in missing.json()["error"]["message"]
    headers = {"x-goog-api-key": CLIENT}
    empty = httpx.post(f"{proxy.url}{PATH}", json={"contents": []}, headers=headers)
    assert empty.status_code == 400
    assert empty.json()["error"] | {"message": ""} == {
        "code": 400,
        "message": "",
        "status": "INVALID_ARGUMENT",
        "details": empty.json()["error"]["details"],
    }
    unknown = httpx.post(
        f"{proxy.url}/v1beta/models/nope:generateContent", json=BODY, headers=headers
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    array = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:streamGenerateContent", json=BODY, headers=headers
    )
    assert array.status_code == 400 and "alt=sse" in array.json()["error"]["message"]
    stranger = _client(proxy, "gk-wrong-key")
    with pytest.raises(errors.ClientError) as raised:
        stranger.models.generate_content(model=MODEL, contents="hi")
    assert raised.value.code == 401


def test_the_key_s_window_answers_resource_exhausted_with_retry_info(proxy: ProxyInThread) -> None:
    client = _client(proxy, LIMITED)
    for _ in range(2):
        client.models.generate_content(model=MODEL, contents="hi", config=_capped(5))
    reply = httpx.post(f"{proxy.url}{PATH}", json=BODY, headers={"x-goog-api-key": LIMITED})
    assert reply.status_code == 429
    error = reply.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED" and error["code"] == 429
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in error["details"]}
    assert details["ErrorInfo"]["reason"] == "key_rpm"  # whose limit it was
    assert details["RetryInfo"]["retryDelay"].endswith("s")
    assert int(details["RetryInfo"]["retryDelay"][:-1]) >= 1
    assert float(reply.headers["retry-after"]) > 0 and "retry-after-ms" in reply.headers
    assert reply.headers["x-ratelimit-limit-requests"] == "2"
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-request-id" in reply.headers
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model=MODEL, contents="hi")
    assert raised.value.code == 429 and raised.value.status == "RESOURCE_EXHAUSTED"


@pytest.mark.serial  # pacing to a strict window: late turns on a loaded host are misses
def test_the_deployment_s_window_is_paced_and_the_upstream_sees_no_429(
    proxy: ProxyInThread, strict: FakeUpstreamHandle
) -> None:
    strict.reset()
    client = _client(proxy)

    async def burst() -> list[Any]:
        calls = [
            client.aio.models.generate_content(model="paced", contents="hi", config=_capped(5))
            for _ in range(3 * STRICT_LIMIT)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(burst())
    failures = [a for a in answers if isinstance(a, BaseException)]
    stats = strict.stats()
    assert not failures, failures[:3]
    assert stats["rejected"] == 0, stats  # paced below the strict window: no upstream 429
    assert stats["served"] == 3 * STRICT_LIMIT


@pytest.mark.slow
def test_the_upstream_s_resource_exhausted_is_learned_from_its_retry_info(
    proxy: ProxyInThread, liar: FakeUpstreamHandle
) -> None:
    """The liar's deployment says 600 a minute; the upstream takes 2 in any 30 s and says
    so in a 429's RetryInfo (no retry-after header). The proxy holds the deployment that
    long (not the configured 1 s cooldown): the next requests never reach the upstream."""
    liar.reset()
    statuses = []
    for _ in range(LIAR_LIMIT + 1):
        reply = httpx.post(
            f"{proxy.url}/v1beta/models/liar:generateContent",
            json=BODY,
            headers={"x-goog-api-key": CLIENT},
            timeout=15,
        )
        statuses.append(reply.status_code)
    assert statuses[:LIAR_LIMIT] == [200] * LIAR_LIMIT
    assert statuses[-1] in (429, 503), statuses
    assert liar.stats()["rejected"] == 1
    asked = liar.stats()["requests"]
    # Past the configured cooldown (1 s), well within the RetryInfo's ~30 s: still held.
    for _ in range(2):
        reply = httpx.post(
            f"{proxy.url}/v1beta/models/liar:generateContent",
            json=BODY,
            headers={"x-goog-api-key": IMPATIENT},  # waits 100 ms at most
            timeout=15,
        )
        assert reply.status_code in (429, 503), reply.text
        assert reply.json()["error"]["status"] in ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
    assert liar.stats()["requests"] == asked  # the hold kept them from the upstream
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'reason="rate_limited"' in metrics


@pytest.mark.slow
def test_no_credential_is_logged_answered_or_shown(
    proxy: ProxyInThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bodies = []
    with httpx.Client(base_url=proxy.url, timeout=15) as client:
        for key in (CLIENT, "gk-wrong-key"):
            bodies.append(client.post(PATH, json=BODY, headers={"x-goog-api-key": key}).text)
        bodies.append(client.post(f"{PATH}?key={QUERY_KEY}", json=BODY).text)
        bodies.append(client.post(f"{PATH}?key={QUERY_KEY}&key=x", json=BODY).text)
        bodies.append(client.post(f"{PATH}?key={QUERY_KEY}", json={"contents": 1}).text)
        bodies.append(
            client.post(
                "/v1beta/models/liar:generateContent", json=BODY, headers={"x-goog-api-key": CLIENT}
            ).text
        )
        bodies.append(client.get("/metrics").text)
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        state = client.get("/admin/state", headers=admin)
        assert state.status_code == 200
        bodies.append(state.text.replace(ADMIN_KEY, ""))  # (the admin key is the caller's own)
    proxy.settled()
    # Every record but the test's own client's lines about its requests to the proxy.
    mine = f"Request: POST {proxy.url}"
    records = [r for r in caplog.records if not (r.name == "httpx" and mine in r.getMessage())]
    seen = "\n".join(bodies) + "\n" + "\n".join(str(r.__dict__) for r in records)
    for secret in SECRETS:
        at = seen.find(secret)
        assert at < 0, seen[max(at - 300, 0) : at + 100]
