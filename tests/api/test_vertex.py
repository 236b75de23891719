"""Vertex AI deployments, end to end: the ``anthropic`` SDK, as Claude Code's users point
it at the proxy, through the proxy to the fake upstream speaking Vertex AI's paths
(``rawPredict``, ``streamRawPredict``, ``count-tokens:rawPredict``), which takes only
bearer tokens its token endpoint issued to the test's service account (an RSA key pair
made per run, the JWT assertion verified with its public key).

Served and streamed; the proxy paces the deployment's windows so that the strict
upstream sees no 429 (in memory and across two replicas on Redis); Google's 429
(``RESOURCE_EXHAUSTED`` with a ``RetryInfo``) holds the deployment; the token is
refreshed before it expires; the private key and the tokens appear in no log line,
answer, metric or /admin/state."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from google.oauth2 import service_account as google_service_account
from support.google_account import PROJECT, ServiceAccount, service_account
from support.proxy_server import ProxyInThread, ProxyProcess, settings_from, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

MODEL = "claude-sonnet-4-5@20250929"
MESSAGE: dict[str, Any] = {
    "model": "claude",
    "max_tokens": 5,
    "messages": [{"role": "user", "content": "hi"}],
}
CLIENT_KEY = "client-key-0123456789"
HEADERS = {"x-api-key": CLIENT_KEY}
RAW_PREDICT = "POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{action}"


# A replica's first token is fetched before its first turn is asked for (the wire
# ``Readies``), so no request is sent late by the fetch; later tokens are fetched in the
# background before the old one expires. The pacing tests send their burst cold.


@pytest.fixture(scope="module")
def account() -> ServiceAccount:
    return service_account()


def _upstream(account: ServiceAccount, **options: Any) -> FakeUpstreamConfig:
    return FakeUpstreamConfig(
        port=0, chunk_delay=0, google_service_accounts=account.accounts, **options
    )


def _vertex(upstream: FakeUpstreamHandle, key_file: Path, **extra: Any) -> dict[str, Any]:
    return {
        "id": "vertex-east",
        "provider": "vertex",
        "base_url": upstream.url,
        "project": PROJECT,
        "region": "us-east5",
        "credentials_file": str(key_file),
        "model": MODEL,
        **extra,
    }


def _config(deployment: dict[str, Any], **routing: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "claude", "deployments": [deployment]}],
        "routing": {"retries": 0, **routing},
        "admin": {"keys": ["admin-key-0123456789"]},
        "keys": [{"name": "team", "key": CLIENT_KEY}],
    }


def _sdk(proxy: ProxyInThread | ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)


@pytest.fixture(scope="module")
def upstream(account: ServiceAccount) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(_upstream(account)) as handle:
        yield handle


@pytest.fixture(scope="module")
def key_file(
    account: ServiceAccount, upstream: FakeUpstreamHandle, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return account.write(tmp_path_factory.mktemp("gcp") / "sa.json", f"{upstream.url}/token")


def test_the_fakes_paths_are_vertexs_as_anthropics_vertex_sdk_sends_them(
    account: ServiceAccount, upstream: FakeUpstreamHandle, key_file: Path
) -> None:
    """``AnthropicVertex`` with google-auth's service account, straight at the fake:
    its paths, its bearer token and its body are what the fake takes."""
    credentials = google_service_account.Credentials.from_service_account_file(
        str(key_file), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    client = anthropic.AnthropicVertex(
        project_id=PROJECT,
        region="us-east5",
        base_url=f"{upstream.url}/v1",
        credentials=credentials,
        max_retries=0,
    )
    assert client.messages.create(**{**MESSAGE, "model": MODEL}).content[0].type == "text"
    unsigned = httpx.post(
        f"{upstream.url}/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic"
        f"/models/{MODEL}:rawPredict",
        json={"anthropic_version": "vertex-2023-10-16", **MESSAGE},
        headers={"authorization": "Bearer ya29.made-up"},
    )
    assert unsigned.status_code == 401
    assert unsigned.json()["error"]["status"] == "UNAUTHENTICATED"


def test_the_anthropic_sdk_is_served_streamed_and_counted_through_vertex(
    upstream: FakeUpstreamHandle, key_file: Path
) -> None:
    upstream.reset()
    with ProxyInThread(settings_from(_config(_vertex(upstream, key_file)))) as proxy:
        client = _sdk(proxy)
        answer = client.messages.create(**MESSAGE)
        with client.messages.stream(**MESSAGE) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        counted = client.messages.count_tokens(model="claude", messages=MESSAGE["messages"])
    assert answer.content[0].type == "text" and answer.usage.output_tokens == 5
    assert streamed and final.usage.output_tokens == 5
    assert counted.input_tokens > 0
    stats = upstream.stats()
    assert stats["by_endpoint"][RAW_PREDICT] == 3
    assert stats["by_status"] == {"200": 4}  # the token and three answers: no 401
    assert stats["last_request"]["path"].endswith("/models/count-tokens:rawPredict")


@pytest.mark.slow
def test_the_token_is_refreshed_before_it_expires(account: ServiceAccount, tmp_path: Path) -> None:
    """The fake's tokens live 2 s: the proxy takes a new one after half that, and no
    request ever reaches the upstream with an expired one (it would answer 401)."""
    with run_in_thread(_upstream(account, token_lifetime=2.0)) as short:
        key_file = account.write(tmp_path / "sa.json", f"{short.url}/token")
        with ProxyInThread(settings_from(_config(_vertex(short, key_file)))) as proxy:
            client = _sdk(proxy)
            for _ in range(3):
                client.messages.create(**MESSAGE)
                time.sleep(1.1)  # past the refresh moment (half the token's life)
            issued = short.upstream.tokens.issued
            stats = short.stats()
    assert stats["by_status"] == {"200": 6}  # three tokens, three answers: no 401
    assert issued == 3


@pytest.mark.serial  # pacing to a strict window: late turns on a loaded host are misses
def test_the_deployments_window_is_paced_and_the_strict_upstream_sees_no_429(
    account: ServiceAccount, tmp_path: Path
) -> None:
    with run_in_thread(_upstream(account, rpm=4, window=2.0)) as strict:
        key_file = account.write(tmp_path / "sa.json", f"{strict.url}/token")
        deployment = _vertex(strict, key_file, limits=[{"requests": 4, "per": "2s"}])
        with ProxyInThread(settings_from(_config(deployment, max_wait="10s"))) as proxy:
            # No warm-up: the first token is fetched before the first turn is asked for
            # (Readies), so the burst's first request is not sent late by its fetch.
            async def burst() -> list[int]:
                async with httpx.AsyncClient(timeout=30) as http:
                    answers = await asyncio.gather(
                        *(
                            http.post(f"{proxy.base_url}/messages", json=MESSAGE, headers=HEADERS)
                            for _ in range(10)
                        )
                    )
                return [a.status_code for a in answers]

            statuses = asyncio.run(burst())
        stats = strict.stats()
    assert statuses == [200] * 10
    assert stats["rejected"] == 0, stats


def test_googles_429_holds_the_deployment_until_its_retry_info_says(
    account: ServiceAccount, tmp_path: Path
) -> None:
    """No windows configured: the upstream's RESOURCE_EXHAUSTED (no retry-after header,
    a RetryInfo in its body) is the client's 503 ``upstream_rate_limited`` with a
    retry-after from it, and the deployment is held: the next request never reaches it."""
    with run_in_thread(_upstream(account, rpm=1, window=30.0)) as limited:
        key_file = account.write(tmp_path / "sa.json", f"{limited.url}/token")
        config = _config(_vertex(limited, key_file), max_wait=0)
        with ProxyInThread(settings_from(config)) as proxy:
            _sdk(proxy).messages.create(**MESSAGE)
            refused = httpx.post(
                f"{proxy.base_url}/messages", json=MESSAGE, headers=HEADERS, timeout=10
            )
            again = httpx.post(
                f"{proxy.base_url}/messages", json=MESSAGE, headers=HEADERS, timeout=10
            )
        stats = limited.stats()
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "overloaded_error"
    assert "is rate limited" in refused.text
    assert 20 <= int(refused.headers["retry-after"]) <= 30
    assert again.status_code in (429, 503)
    assert stats["by_status"] == {"200": 2, "429": 1}  # (a token); the third never reached it


def test_a_token_endpoint_that_refuses_leaves_the_deployment_unreachable(
    account: ServiceAccount, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key the token endpoint does not know (another account's): 502, the cause
    logged by Google's error code, the key nowhere."""
    stranger = service_account("stranger@test-project.iam.gserviceaccount.com")
    with run_in_thread(_upstream(account)) as upstream:
        key_file = stranger.write(tmp_path / "sa.json", f"{upstream.url}/token")
        with (
            caplog.at_level(logging.DEBUG),
            ProxyInThread(settings_from(_config(_vertex(upstream, key_file)))) as proxy,
        ):
            answer = httpx.post(
                f"{proxy.base_url}/messages", json=MESSAGE, headers=HEADERS, timeout=10
            )
        stats = upstream.stats()
    assert answer.status_code == 502
    assert "vertex-east" in answer.text
    assert "invalid_grant" in caplog.text
    assert stranger.key_line not in caplog.text and stranger.key_line not in answer.text
    assert RAW_PREDICT not in stats["by_endpoint"]  # nothing sent without a token


@pytest.mark.slow
def test_the_key_and_the_tokens_are_never_logged_shown_or_answered(
    account: ServiceAccount, tmp_path: Path
) -> None:
    """A process at debug level, an upstream that quotes the credentials it got in its
    errors (``echo_status``), /metrics and /admin/state: neither the private key nor a
    token issued is in any of them."""
    with run_in_thread(_upstream(account)) as upstream, ExitStack() as stack:
        key_file = account.write(tmp_path / "sa.json", f"{upstream.url}/token")
        config = _config(_vertex(upstream, key_file))
        config["server"] = {"log_level": "debug"}
        (proxy,) = start_together(stack, [ProxyProcess(config, tmp_path)])
        _sdk(proxy).messages.create(**MESSAGE)
        upstream.control(echo_status=400)
        echoed = httpx.post(f"{proxy.base_url}/messages", json=MESSAGE, headers=HEADERS, timeout=10)
        streamed = httpx.post(
            f"{proxy.base_url}/messages",
            json={**MESSAGE, "stream": True},
            headers=HEADERS,
            timeout=10,
        )
        admin = {"authorization": "Bearer admin-key-0123456789"}
        state = httpx.get(f"{proxy.url}/admin/state", headers=admin, timeout=10).text
        metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
        proxy.stop()
        logs = proxy.logs()
        tokens = list(upstream.upstream.tokens.recent)
    assert echoed.status_code == 400 and "you sent" not in echoed.text
    assert tokens and "vertex-east" in logs
    seen = "\n".join([logs, state, metrics, echoed.text, str(echoed.headers), streamed.text])
    assert account.key_line not in seen
    assert all(token not in seen for token in tokens)


@pytest.mark.serial
@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")
def test_two_replicas_on_redis_pace_the_window_and_the_upstream_sees_no_429(
    account: ServiceAccount, tmp_path: Path
) -> None:
    with run_in_thread(_upstream(account, rpm=6, window=3.0)) as strict, ExitStack() as stack:
        key_file = account.write(tmp_path / "sa.json", f"{strict.url}/token")
        redis = stack.enter_context(RedisServer(tmp_path / "redis"))
        deployment = _vertex(strict, key_file, limits=[{"requests": 6, "per": "3s"}])
        config = {**_config(deployment, max_wait="15s"), "redis": {"url": redis.url}}
        replicas = start_together(
            stack, [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(2)]
        )

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as http:
                answers = await asyncio.gather(
                    *(
                        http.post(
                            f"{replicas[i % 2].base_url}/messages", json=MESSAGE, headers=HEADERS
                        )
                        for i in range(16)
                    )
                )
            return [a.status_code for a in answers]

        statuses = asyncio.run(burst())
        stats = strict.stats()
    assert statuses == [200] * 16
    assert stats["rejected"] == 0, stats
    assert stats["served"] == 16
