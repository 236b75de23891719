"""The fake upstream in Azure mode: Azure OpenAI's paths, api-key, api-version and errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.fake_upstream.cli import build_parser, config_from_args

KEY = "azure-key-1234"
VERSION = "2024-10-21"
CHAT = {"messages": [{"role": "user", "content": "Hello there, Azure!"}]}
PATH = f"/openai/deployments/gpt-4o/chat/completions?api-version={VERSION}"


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {"azure": True, "api_key": KEY}


@pytest.fixture
def client(upstream: FakeUpstreamHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=upstream.url, timeout=5) as http:
        yield http


def _azure_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"code", "message"}  # Azure's gateway shape, not OpenAI's
    assert error["code"] == code
    return str(error["message"])


def test_azure_sdk_chat_stream_completions_and_embeddings(upstream: FakeUpstreamHandle) -> None:
    sdk = openai.AzureOpenAI(
        azure_endpoint=upstream.url, api_key=KEY, api_version=VERSION, max_retries=0
    )
    chat = sdk.chat.completions.create(model="gpt-4o", messages=CHAT["messages"], max_tokens=4)
    assert chat.model == "gpt-4o" and chat.usage is not None
    assert chat.usage.completion_tokens == 4
    chunks = list(
        sdk.chat.completions.create(
            model="gpt-4o-mini", messages=CHAT["messages"], stream=True, max_tokens=3
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split()
    legacy = sdk.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=2)
    assert legacy.usage is not None and legacy.usage.completion_tokens == 2
    vectors = sdk.embeddings.create(model="text-embedding-3-small", input=["a"])
    assert len(vectors.data[0].embedding) == 8
    last = upstream.stats()["last_request"]
    assert last["path"] == "/openai/deployments/text-embedding-3-small/embeddings"


def test_the_deployment_in_the_path_decides_not_the_body(client: httpx.Client) -> None:
    body = {**CHAT, "model": "something-else"}
    response = client.post(PATH, json=body, headers={"api-key": KEY})
    assert response.status_code == 200 and response.json()["model"] == "gpt-4o"
    assert client.post(PATH, json=CHAT, headers={"api-key": KEY}).status_code == 200


def test_the_key_must_come_as_api_key(client: httpx.Client) -> None:
    for headers in ({}, {"api-key": "wrong"}, {"Authorization": f"Bearer {KEY}"}):
        message = _azure_error(client.post(PATH, json=CHAT, headers=headers), 401, "401")
        assert message.startswith("Access denied due to invalid subscription key")


def test_api_version_and_deployment_are_checked(client: httpx.Client) -> None:
    key = {"api-key": KEY}
    missing = "/openai/deployments/gpt-4o/chat/completions"
    assert _azure_error(client.post(missing, json=CHAT, headers=key), 404, "404") == (
        "Resource not found"
    )
    wrong = "/openai/deployments/gpt-4o/chat/completions?api-version=2099-01-01"
    message = _azure_error(client.post(wrong, json=CHAT, headers=key), 400, "BadRequest")
    assert message == "API version not supported"
    unknown = f"/openai/deployments/nope/chat/completions?api-version={VERSION}"
    _azure_error(client.post(unknown, json=CHAT, headers=key), 404, "DeploymentNotFound")
    # OpenAI's paths do not exist on an Azure resource.
    _azure_error(client.post("/v1/chat/completions", json=CHAT, headers=key), 404, "404")


def test_azure_429s_and_headers() -> None:
    config = FakeUpstreamConfig(port=0, azure=True, rpm=2, tpm=10_000, window=60)
    with run_in_thread(config) as upstream, httpx.Client(base_url=upstream.url) as http:
        for left in (1, 0):
            ok = http.post(PATH, json=CHAT, headers={"api-key": "any"})
            assert ok.status_code == 200
            # Azure says what is left, never the limit or when it resets.
            assert ok.headers["x-ratelimit-remaining-requests"] == str(left)
            assert "x-ratelimit-remaining-tokens" in ok.headers
            assert "x-ratelimit-limit-requests" not in ok.headers
            assert "x-ratelimit-reset-requests" not in ok.headers
        refused = http.post(PATH, json=CHAT, headers={"api-key": "any"})
        message = _azure_error(refused, 429, "429")
        seconds = int(refused.headers["retry-after"])
        assert 0 < seconds <= 60 and int(refused.headers["retry-after-ms"]) <= seconds * 1000
        assert f"ChatCompletions_Create Operation under Azure OpenAI API version {VERSION}" in (
            message
        )
        assert f"Please retry after {seconds} seconds" in message


def test_azure_mode_from_the_command_line() -> None:
    args = build_parser().parse_args(
        ["--azure", "--azure-api-versions", "2024-10-21, 2024-06-01", "--models", "dep-a"]
    )
    config = config_from_args(args)
    assert config.azure and config.azure_api_versions == ("2024-10-21", "2024-06-01")
    assert config.models == ("dep-a",)
    assert "azure (deployments: dep-a)" in config.describe()


# ------------------------------------------------------------------ the Responses API

RESPONSES_VERSION = "2025-04-01-preview"


@pytest.mark.slow
def test_azure_sdk_responses_at_openai_responses_with_an_api_version(
    upstream: FakeUpstreamHandle,
) -> None:
    sdk = openai.AzureOpenAI(
        azure_endpoint=upstream.url, api_key=KEY, api_version=RESPONSES_VERSION, max_retries=0
    )
    created = sdk.responses.create(model="gpt-4o", input="Hello there, Azure!")
    assert created.status == "completed" and created.model == "gpt-4o"
    assert upstream.stats()["last_request"]["path"] == "/openai/responses"
    assert sdk.responses.retrieve(created.id).id == created.id
    with sdk.responses.stream(model="gpt-4o", input="x") as stream:
        assert stream.get_final_response().status == "completed"
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


def test_the_v1_path_needs_no_api_version_and_takes_a_bearer_key(
    upstream: FakeUpstreamHandle,
) -> None:
    sdk = openai.OpenAI(base_url=f"{upstream.url}/openai/v1/", api_key=KEY, max_retries=0)
    created = sdk.responses.create(model="gpt-4o-mini", input="x")
    assert created.status == "completed"
    assert upstream.stats()["last_request"]["path"] == "/openai/v1/responses"
    follow_up = sdk.responses.create(
        model="gpt-4o-mini", input="y", previous_response_id=created.id
    )
    assert follow_up.previous_response_id == created.id


def test_responses_paths_check_version_deployment_and_key(client: httpx.Client) -> None:
    key = {"api-key": KEY}
    body = {"model": "gpt-4o", "input": "x"}
    missing = client.post("/openai/responses", json=body, headers=key)
    assert _azure_error(missing, 404, "404") == "Resource not found"
    wrong = client.post("/openai/responses?api-version=2024-10-21", json=body, headers=key)
    _azure_error(wrong, 400, "BadRequest")
    unknown = {"model": "nope", "input": "x"}
    _azure_error(
        client.post("/openai/v1/responses", json=unknown, headers=key), 404, "DeploymentNotFound"
    )
    _azure_error(client.post("/openai/v1/responses", json=body), 401, "401")
    assert client.post(
        "/openai/v1/responses?api-version=preview", json=body, headers=key
    ).is_success
    gone = client.get("/openai/v1/responses/resp_other", headers=key)
    assert gone.status_code == 404


def test_azure_responses_429_names_the_operation() -> None:
    config = FakeUpstreamConfig(port=0, azure=True, rpm=1, window=60)
    with run_in_thread(config) as upstream, httpx.Client(base_url=upstream.url) as http:
        path = f"/openai/responses?api-version={RESPONSES_VERSION}"
        body = {"model": "gpt-4o", "input": "x"}
        assert http.post(path, json=body, headers={"api-key": "any"}).status_code == 200
        refused = http.post(path, json=body, headers={"api-key": "any"})
        assert "Responses_Create Operation" in _azure_error(refused, 429, "429")
