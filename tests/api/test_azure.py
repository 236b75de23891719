"""Azure OpenAI deployments, end to end: the official OpenAI SDK, as a user points it at
the proxy, through the proxy to the fake upstream in Azure mode, which checks the path,
the api-version and the api-key as Azure does (a wrong one fails the request there).

A misconfigured Azure deployment (wrong key, api-version or deployment name) is the
deployment's fault: the client gets the proxy's OpenAI-shaped upstream error, or the
request is served by another deployment. An Azure 429 holds its deployment as OpenAI's do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.upstream.redact import REDACTED

AZURE_KEY = "azure-0123456789abcdef"
VERSION = "2024-10-21"
CHAT: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
}


@pytest.fixture(scope="module")
def azure() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(
        port=0,
        chunk_delay=0,
        azure=True,
        api_key=AZURE_KEY,
        models=("gpt-4o-prod", "embed-prod", "instruct-prod"),
    )
    with run_in_thread(config) as handle:
        yield handle


def _azure(upstream: FakeUpstreamHandle, deployment: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"az-{deployment}",
        "provider": "azure",
        "base_url": upstream.url,
        "deployment": deployment,
        "api_version": VERSION,
        "api_key": AZURE_KEY,
        **extra,
    }


def _config(groups: dict[str, list[dict[str, Any]]], **routing: Any) -> dict[str, Any]:
    models = [{"name": name, "deployments": ds} for name, ds in groups.items()]
    return {"models": models, "routing": {"retries": 0, **routing}}


def _sdk(proxy: ProxyInThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def proxy(azure: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    config = _config(
        {
            "gpt-4o": [_azure(azure, "gpt-4o-prod")],
            "text-embedding-3-small": [_azure(azure, "embed-prod")],
            "gpt-3.5-turbo-instruct": [_azure(azure, "instruct-prod")],
        }
    )
    with ProxyInThread(settings_from(config)) as server:
        yield server


def test_the_openai_sdk_chats_streams_embeds_and_completes_through_azure(
    proxy: ProxyInThread, azure: FakeUpstreamHandle
) -> None:
    client = _sdk(proxy)
    # A client's own api-key header never reaches Azure: the fake would refuse it.
    chat = client.chat.completions.create(**CHAT, extra_headers={"api-key": "client-own-key"})
    assert chat.choices[0].message.content and chat.usage is not None
    seen = azure.stats()["last_request"]
    assert seen["path"] == "/openai/deployments/gpt-4o-prod/chat/completions"
    assert seen["headers"]["api-key"] == AZURE_KEY
    assert "authorization" not in seen["headers"]

    chunks = list(client.chat.completions.create(**CHAT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert all(c.usage is None for c in chunks)  # the usage the proxy asked for is its own

    vectors = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [len(v.embedding) for v in vectors.data] == [8, 8]
    legacy = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=3)
    assert legacy.usage is not None and legacy.usage.completion_tokens == 3
    assert azure.stats()["by_status"].keys() == {"200"}


def test_the_responses_api_reaches_azure_at_its_v1_path_naming_the_deployment(
    proxy: ProxyInThread, azure: FakeUpstreamHandle
) -> None:
    client = _sdk(proxy)
    created = client.responses.create(model="gpt-4o", input="hi", max_output_tokens=16)
    assert created.status in ("completed", "incomplete") and created.output_text
    seen = azure.stats()["last_request"]
    assert seen["path"] == "/openai/v1/responses"  # the v1 API: no api-version
    assert seen["model"] == "gpt-4o-prod"  # Azure's deployment, in the body
    assert seen["headers"]["api-key"] == AZURE_KEY
    events = [e.type for e in client.responses.create(model="gpt-4o", input="x", stream=True)]
    assert events[0] == "response.created" and events[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert client.responses.retrieve(created.id).id == created.id
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    assert azure.stats()["unknown_response_ids"] == 0


@pytest.mark.parametrize(
    ("wrong", "status"),
    [
        ({"api_key": "not-the-key"}, 401),
        ({"api_version": "2099-01-01"}, 400),
        ({"deployment": "no-such-deployment"}, 404),
    ],
    ids=["api_key", "api_version", "deployment"],
)
def test_a_misconfigured_azure_deployment_is_the_proxys_upstream_error(
    azure: FakeUpstreamHandle, wrong: dict[str, str], status: int
) -> None:
    """Alone, the client gets a 502 in OpenAI's shape naming the deployment; beside a good
    deployment, the request is served there and the bad one is cooled (tried once)."""
    bad = {**_azure(azure, "gpt-4o-prod"), **wrong, "id": "bad"}
    azure.reset()
    with (
        ProxyInThread(settings_from(_config({"gpt-4o": [bad]}))) as proxy,
        pytest.raises(openai.APIStatusError) as refused,
    ):
        _sdk(proxy).chat.completions.create(**CHAT)
    assert refused.value.status_code == 502
    answer = refused.value.response
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == ("upstream_auth_error" if status == 401 else "upstream_error")
    assert "'bad'" in error["message"]
    assert AZURE_KEY not in answer.text and "not-the-key" not in answer.text
    assert azure.stats()["by_status"] == {str(status): 1}

    azure.reset()
    good = _azure(azure, "gpt-4o-prod")
    config = _config({"gpt-4o": [{**bad, "weight": 1e9}, good]}, retries=1)
    with ProxyInThread(settings_from(config)) as proxy:
        answers = [_sdk(proxy).chat.completions.create(**CHAT) for _ in range(4)]
    assert all(a.choices[0].message.content for a in answers)
    assert azure.stats()["by_status"] == {str(status): 1, "200": 4}


def test_an_azure_429_holds_its_deployment_as_an_openai_one_does() -> None:
    """Azure's 429 (retry-after and retry-after-ms, its own body) holds the deployment
    until then: the next requests go elsewhere, none reaches it meanwhile; alone, the
    client gets 503 upstream_rate_limited with a retry-after from the upstream's."""
    limited_config = FakeUpstreamConfig(
        port=0, azure=True, api_key=AZURE_KEY, models=("gpt-4o-prod",), rpm=1, window=60.0
    )
    with (
        run_in_thread(limited_config) as limited,
        run_in_thread(FakeUpstreamConfig(port=0, azure=True, models=("gpt-4o-prod",))) as good,
    ):
        config = _config(
            {"gpt-4o": [_azure(limited, "gpt-4o-prod", weight=1e9), _azure(good, "gpt-4o-prod")]},
            retries=1,
        )
        config["models"][0]["deployments"][0]["id"] = "limited"
        with ProxyInThread(settings_from(config)) as proxy:
            answers = [_sdk(proxy).chat.completions.create(**CHAT) for _ in range(6)]
        assert all(a.choices[0].message.content for a in answers)
        assert limited.stats()["by_status"] == {"200": 1, "429": 1}
        assert good.stats()["served"] == 5

        limited.reset()
        alone = _config({"gpt-4o": [_azure(limited, "gpt-4o-prod")]}, max_wait=0)
        with ProxyInThread(settings_from(alone)) as proxy:
            _sdk(proxy).chat.completions.create(**CHAT)
            refused = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
            again = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "upstream_rate_limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # Held: the next request is refused by the proxy, never sent to Azure.
        assert again.status_code in (429, 503)
        assert limited.stats()["by_status"] == {"200": 1, "429": 1}


@pytest.mark.parametrize("status", [400, 422])
def test_azure_errors_quoting_the_key_reach_the_client_without_it(status: int) -> None:
    config = FakeUpstreamConfig(port=0, azure=True, models=("gpt-4o-prod",), echo_status=status)
    with run_in_thread(config) as echo:
        proxy_config = _config({"gpt-4o": [_azure(echo, "gpt-4o-prod")]})
        with ProxyInThread(settings_from(proxy_config)) as proxy:
            plain = httpx.post(f"{proxy.base_url}/chat/completions", json=CHAT, timeout=10)
            echo.control(echo_status=200)
            streamed = httpx.post(
                f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=10
            )
    assert plain.status_code == status and streamed.status_code == 200
    for response in (plain, streamed):
        everything = response.text + str(dict(response.headers))
        assert AZURE_KEY not in everything and REDACTED in everything
