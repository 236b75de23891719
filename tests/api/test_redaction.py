"""The deployment's upstream key never reaches a client, whatever the upstream quotes:
an echoing upstream (some OpenAI-compatible servers quote the credentials they got in
their errors) answers 400, 404 and 422, plain and streamed, and a streamed 200 whose
chunks quote it; the client sees the key nowhere, in bodies or headers."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.upstream.redact import REDACTED

SECRET = "sk-deploy-secret-0123456789"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, api_key=SECRET)) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle, serving_path: str) -> Iterator[ProxyInThread]:
    deployment = {"id": "d", "base_url": upstream.base_url, "api_key": SECRET}
    config = {"models": [{"name": "m", "deployments": [deployment]}], "routing": {"retries": 0}}
    with ProxyInThread(settings_from(config)) as server:
        yield server


def _everything(response: httpx.Response) -> str:
    return response.text + "".join(f"{k}: {v}\n" for k, v in response.headers.items())


@pytest.mark.parametrize("status", [400, 404, 422])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_upstream_error_quoting_the_key_reaches_the_client_without_it(
    proxy: ProxyInThread,
    upstream: FakeUpstreamHandle,
    caplog: pytest.LogCaptureFixture,
    status: int,
    stream: bool,
) -> None:
    upstream.control(echo_status=status)
    try:
        with caplog.at_level(logging.DEBUG):
            response = httpx.post(
                f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": stream}, timeout=10
            )
    finally:
        upstream.control(echo_status=None)
    assert response.status_code == status
    assert SECRET not in _everything(response)
    assert REDACTED in response.json()["error"]["message"]
    assert REDACTED in response.headers["openai-model"]
    assert SECRET not in caplog.text


def test_a_stream_quoting_the_key_across_two_chunks_reaches_the_client_without_it(
    proxy: ProxyInThread, upstream: FakeUpstreamHandle
) -> None:
    upstream.control(echo_status=200)
    try:
        with httpx.stream(
            "POST", f"{proxy.base_url}/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            chunks = list(response.iter_raw())
    finally:
        upstream.control(echo_status=None)
    text = b"".join(chunks).decode()
    assert response.status_code == 200
    assert SECRET not in text and REDACTED in text
    assert text.rstrip().endswith("data: [DONE]")
