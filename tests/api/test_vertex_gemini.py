"""Google's models on Vertex AI, end to end: Google's ``google-genai`` SDK, pointed at the
proxy's Gemini API (``genai.Client(api_key=..., http_options=HttpOptions(base_url=proxy))``),
through the proxy to the fake upstream speaking Vertex AI's ``publishers/google/models/
{model}:generateContent`` and ``:streamGenerateContent?alt=sse``, which takes only bearer
tokens its token endpoint issued to the test's service account (docs/vertex.md).

Served and streamed; a strict upstream window paced so that it sees no 429; Vertex's 429
(``RESOURCE_EXHAUSTED`` with a ``RetryInfo``, no retry-after header) holds the
deployment; a group of a ``gemini`` and a ``vertex`` deployment serves one Gemini client;
the private key and the tokens appear in no log line, answer, metric or /admin/state. On
the memory limiter and on a Redis the test starts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from google import genai
from google.genai import types
from google.oauth2 import service_account as google_service_account
from support.google_account import PROJECT, ServiceAccount, service_account
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

MODEL = "gemini-2.5-flash"
REGION = "us-central1"
CLIENT = "gk-client-vertex-0123456789"
IMPATIENT = "gk-client-impatient-0123456789"
ADMIN_KEY = "gk-admin-vertex-0123456789"
GEMINI_KEY = "AIza-upstream-secret-0123456789"  # the mixed group's gemini deployment's
BODY = {"contents": [{"role": "user", "parts": [{"text": "Hello there, fake!"}]}]}
GOOGLE_MODELS = "POST /v1/projects/{project}/locations/{region}/publishers/google/models/{action}"
GEMINI_API = "POST /v1beta/models/{target}"
# The strict upstream behind "paced": this many requests in any window of this many s.
STRICT_LIMIT = 4
STRICT_WINDOW = 2.0
# The one behind "liar" (its deployment says 600 a minute): 2 in any 30 s.
LIAR_LIMIT = 2
LIAR_WINDOW = 30.0
# The mixed group: each deployment takes this many an hour (a window longer than a
# minute holds its whole allowance at once), so twice as many requests are served by
# both, whichever the router picks first.
MIXED_EACH = 3


@pytest.fixture(scope="module")
def account() -> ServiceAccount:
    return service_account()


def _fake(account: ServiceAccount, **options: Any) -> FakeUpstreamConfig:
    return FakeUpstreamConfig(
        port=0,
        api_key=GEMINI_KEY,
        chunk_delay=0.001,
        google_service_accounts=account.accounts,
        **options,
    )


@pytest.fixture(scope="module")
def upstream(account: ServiceAccount) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(_fake(account)) as handle:
        yield handle


@pytest.fixture(scope="module")
def strict(account: ServiceAccount) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(_fake(account, rpm=STRICT_LIMIT, window=STRICT_WINDOW)) as handle:
        yield handle


@pytest.fixture(scope="module")
def liar(account: ServiceAccount) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(_fake(account, rpm=LIAR_LIMIT, window=LIAR_WINDOW)) as handle:
        yield handle


@pytest.fixture(scope="module")
def key_files(
    account: ServiceAccount,
    upstream: FakeUpstreamHandle,
    strict: FakeUpstreamHandle,
    liar: FakeUpstreamHandle,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """A key file per fake (each one's token endpoint issues the tokens it takes)."""
    folder = tmp_path_factory.mktemp("gcp")
    fakes = {"upstream": upstream, "strict": strict, "liar": liar}
    return {
        name: account.write(folder / f"{name}.json", f"{fake.url}/token")
        for name, fake in fakes.items()
    }


def _vertex(id_: str, fake: FakeUpstreamHandle, key_file: Path, **extra: Any) -> dict[str, Any]:
    return {
        "id": id_,
        "provider": "vertex",
        "base_url": fake.url,
        "project": PROJECT,
        "region": REGION,
        "credentials_file": str(key_file),
        "model": MODEL,
        **extra,
    }


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
def proxy(
    redis_url: str,
    upstream: FakeUpstreamHandle,
    strict: FakeUpstreamHandle,
    liar: FakeUpstreamHandle,
    key_files: dict[str, Path],
) -> Iterator[ProxyInThread]:
    mixed = [
        {
            "id": "mixed-gemini",
            "provider": "gemini",
            "base_url": upstream.url,
            "api_key": GEMINI_KEY,
            "model": MODEL,
            "limits": [{"requests": MIXED_EACH, "per": "1h"}],
        },
        _vertex(
            "mixed-vertex",
            upstream,
            key_files["upstream"],
            limits=[{"requests": MIXED_EACH, "per": "1h"}],
        ),
    ]
    strict_limits = [{"requests": STRICT_LIMIT, "per": f"{STRICT_WINDOW:g}s"}]
    config = {
        "redis": {"url": redis_url},
        "admin": {"keys": [ADMIN_KEY]},
        "keys": [
            {"name": "app", "key": CLIENT},
            {"name": "impatient", "key": IMPATIENT, "max_wait": "100ms"},
        ],
        "models": [
            {
                "name": MODEL,
                "deployments": [_vertex("vertex-central", upstream, key_files["upstream"])],
            },
            {
                "name": "paced",
                "deployments": [
                    _vertex("vertex-paced", strict, key_files["strict"], limits=strict_limits)
                ],
            },
            {
                "name": "liar",
                "deployments": [_vertex("vertex-liar", liar, key_files["liar"], rpm=600)],
            },
            {"name": "mixed", "deployments": mixed},
            {
                "name": "claude",
                "deployments": [
                    _vertex(
                        "vertex-claude",
                        upstream,
                        key_files["upstream"],
                        model="claude-sonnet-4-5@20250929",
                    )
                ],
            },
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


def _google_path(model: str, method: str) -> str:
    return f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/google/models/{model}:{method}"


def test_the_fakes_paths_are_vertexs_as_googles_sdk_sends_them(
    upstream: FakeUpstreamHandle, key_files: dict[str, Path]
) -> None:
    """``genai.Client(vertexai=True)`` with google-auth's service account, straight at the
    fake: its paths, its bearer token and its bodies are what the fake takes; a made-up
    token is refused as Google refuses it."""
    credentials = google_service_account.Credentials.from_service_account_file(
        str(key_files["upstream"]), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    client = genai.Client(
        vertexai=True,
        project=PROJECT,
        location=REGION,
        credentials=credentials,
        http_options=types.HttpOptions(base_url=upstream.url, api_version="v1"),
    )
    answer = client.models.generate_content(model=MODEL, contents="hi", config=_capped(7))
    assert answer.text and answer.usage_metadata is not None
    assert answer.usage_metadata.candidates_token_count == 7
    streamed = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert len(streamed) > 1 and streamed[-1].usage_metadata is not None
    assert upstream.stats()["last_request"]["path"] == _google_path(MODEL, "streamGenerateContent")
    made_up = httpx.post(
        f"{upstream.url}{_google_path(MODEL, 'generateContent')}",
        json=BODY,
        headers={"authorization": "Bearer ya29.made-up"},
    )
    assert made_up.status_code == 401
    assert made_up.json()["error"]["status"] == "UNAUTHENTICATED"


def test_a_plain_answer_through_the_sdk(proxy: ProxyInThread, upstream: FakeUpstreamHandle) -> None:
    client = _client(proxy)  # (kept: a client collected closes its connections)
    answer = client.models.generate_content(model=MODEL, contents="Hello there", config=_capped(12))
    assert answer.text
    usage = answer.usage_metadata
    assert usage is not None and usage.candidates_token_count == 12
    seen = upstream.stats()["last_request"]
    assert seen["path"] == _google_path(MODEL, "generateContent")
    assert seen["headers"]["authorization"].startswith("Bearer ya29.fake-")  # its token
    assert "x-goog-api-key" not in seen["headers"]  # the client's key stays here
    assert seen["body"]["generationConfig"] == {"maxOutputTokens": 12}
    assert "model" not in seen["body"]


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
    assert seen["path"] == _google_path(MODEL, "streamGenerateContent")
    raw = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
        json=BODY,
        headers={"x-goog-api-key": CLIENT},
        timeout=15,
    )
    assert raw.status_code == 200
    assert b"\r\n" not in raw.content  # Vertex's CRLF events, as LF ones
    assert raw.text.count("data: ") > 1


def test_a_vertex_deployment_serves_only_its_models_api(proxy: ProxyInThread) -> None:
    """A Gemini model's deployment is not offered to the Messages API's clients (nor a
    Claude model's to Gemini's): their request is refused before it could reach the
    upstream (whose 404 would cool the deployment)."""
    messages = anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        messages.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert "is not served through the messages API" in str(refused.value.body)
    reply = httpx.post(
        f"{proxy.url}/v1beta/models/claude:generateContent",
        json=BODY,
        headers={"x-goog-api-key": CLIENT},
        timeout=15,
    )
    assert reply.status_code == 400 and reply.json()["error"]["status"] == "INVALID_ARGUMENT"
    anthropic_client = {"x-api-key": CLIENT, "anthropic-version": "2023-06-01"}
    listed = httpx.get(f"{proxy.url}/v1/models", headers=anthropic_client, timeout=15)
    names = {m["id"] for m in listed.json()["data"]}
    assert "claude" in names and MODEL not in names


@pytest.mark.serial  # pacing to a strict window: late turns on a loaded host are misses
def test_the_deployment_s_window_is_paced_and_the_upstream_sees_no_429(
    proxy: ProxyInThread, strict: FakeUpstreamHandle
) -> None:
    strict.reset()  # its record of the other limiter's run (a module's fake)
    client = _client(proxy)
    # No warm-up: the first token is fetched before the first turn (the wire Readies).

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
    assert stats["by_endpoint"][GOOGLE_MODELS] == 3 * STRICT_LIMIT


def test_vertex_s_resource_exhausted_is_learned_from_its_retry_info(
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
    retry_after = float(reply.headers["retry-after"])
    assert LIAR_WINDOW - 10 <= retry_after <= LIAR_WINDOW  # its RetryInfo's, not 1 s
    asked = liar.stats()["requests"]
    for _ in range(2):  # past the configured cooldown (1 s): still held
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


def test_a_group_of_a_gemini_and_a_vertex_deployment_serves_one_gemini_client(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    """Each takes ``MIXED_EACH`` an hour: twice as many requests, plain and streamed,
    are all served, by both (the Gemini API's path with its key, Vertex's with a token),
    and neither is sent more than its window holds."""
    upstream.reset()
    client = _client(proxy)
    for index in range(2 * MIXED_EACH):
        if index % 2:
            chunks = list(
                client.models.generate_content_stream(
                    model="mixed", contents="hi", config=_capped(6)
                )
            )
            usage = chunks[-1].usage_metadata
        else:
            usage = client.models.generate_content(
                model="mixed", contents="hi", config=_capped(6)
            ).usage_metadata
        assert usage is not None and usage.candidates_token_count == 6
    stats = upstream.stats()
    assert stats["by_endpoint"][GEMINI_API] == MIXED_EACH
    assert stats["by_endpoint"][GOOGLE_MODELS] == MIXED_EACH
    assert stats["rejected"] == 0 and stats["by_status"].get("401") is None


def test_the_key_and_the_tokens_are_never_logged_shown_or_answered(
    proxy: ProxyInThread,
    upstream: FakeUpstreamHandle,
    account: ServiceAccount,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Debug logging, an upstream that quotes the credentials it got in its errors
    (``echo_status``), /metrics and /admin/state: neither the private key nor a token
    issued is in any of them."""
    caplog.set_level(logging.DEBUG)
    path = f"/v1beta/models/{MODEL}:generateContent"
    headers = {"x-goog-api-key": CLIENT}
    bodies = []
    with httpx.Client(base_url=proxy.url, timeout=15) as http:
        bodies.append(http.post(path, json=BODY, headers=headers).text)
        upstream.control(echo_status=400)
        try:
            echoed = http.post(path, json=BODY, headers=headers)
            streamed = http.post(
                f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", json=BODY, headers=headers
            )
        finally:
            upstream.control(echo_status=None)
        bodies += [echoed.text, str(echoed.headers), streamed.text]
        bodies.append(http.get("/metrics").text)
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        state = http.get("/admin/state", headers=admin)
        assert state.status_code == 200
        bodies.append(state.text)
    proxy.settled()
    tokens = list(upstream.upstream.tokens.recent)
    assert echoed.status_code == 400 and "you sent" not in echoed.text
    assert tokens
    logged = "\n".join(str(r.__dict__) for r in caplog.records)
    assert "vertex-central" in logged  # the proxy's lines about these requests were seen
    seen = "\n".join(bodies) + "\n" + logged
    assert account.key_line not in seen
    for token in tokens:
        at = seen.find(token)
        assert at < 0, seen[max(at - 300, 0) : at + 100]
