"""The fake upstream's Vertex AI paths for Google's models: ``publishers/google/models/
{model}:generateContent`` and ``:streamGenerateContent?alt=sse``, under a bearer token its
token endpoint issued (google-auth fetches it), the Gemini API's bodies and CRLF events,
and Vertex's 429: ``RESOURCE_EXHAUSTED`` with a ``RetryInfo``, no retry-after header."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import google.auth.transport.requests
import httpx
import pytest
from google.oauth2 import service_account as google_service_account
from support.google_account import PROJECT, service_account

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

MODEL = "gemini-2.5-flash"
BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
MODELS = f"/v1/projects/{PROJECT}/locations/us-central1/publishers/google/models"


@pytest.fixture
def vertex(tmp_path: Path) -> Iterator[tuple[FakeUpstreamHandle, dict[str, str]]]:
    """A fake taking one request a minute, and the headers carrying a token it issued."""
    account = service_account()
    config = FakeUpstreamConfig(
        port=0, chunk_delay=0, rpm=1, window=60.0, google_service_accounts=account.accounts
    )
    with run_in_thread(config) as fake:
        key_file = account.write(tmp_path / "sa.json", f"{fake.url}/token")
        credentials = google_service_account.Credentials.from_service_account_file(
            str(key_file), scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
        credentials.refresh(google.auth.transport.requests.Request())
        yield fake, {"authorization": f"Bearer {credentials.token}"}


def test_an_answer_then_resource_exhausted_with_retry_info(
    vertex: tuple[FakeUpstreamHandle, dict[str, str]],
) -> None:
    fake, headers = vertex
    url = f"{fake.url}{MODELS}/{MODEL}:generateContent"
    answer = httpx.post(url, json=BODY, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usageMetadata"]["promptTokenCount"] > 0
    assert answer.json()["modelVersion"] == MODEL
    refused = httpx.post(url, json=BODY, headers=headers)
    assert refused.status_code == 429 and "retry-after" not in refused.headers
    error = refused.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    assert f"base model: {MODEL}" in error["message"] and "generate_content" in error["message"]
    (retry,) = error["details"]
    assert retry["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
    assert 50 < float(retry["retryDelay"].removesuffix("s")) <= 60


def test_a_stream_s_events_end_in_crlf_and_only_sse_is_streamed(
    vertex: tuple[FakeUpstreamHandle, dict[str, str]],
) -> None:
    fake, headers = vertex
    stream = f"{fake.url}{MODELS}/{MODEL}:streamGenerateContent"
    array = httpx.post(stream, json=BODY, headers=headers)
    assert array.status_code == 400  # (Google's JSON array: not spoken by the fake)
    streamed = httpx.post(f"{stream}?alt=sse", json=BODY, headers=headers)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content.endswith(b"\r\n\r\n") and b'"finishReason"' in streamed.content


def test_a_body_naming_a_model_a_missing_token_and_an_unknown_method_are_refused(
    vertex: tuple[FakeUpstreamHandle, dict[str, str]],
) -> None:
    fake, headers = vertex
    url = f"{fake.url}{MODELS}/{MODEL}:generateContent"
    named = httpx.post(url, json={**BODY, "model": MODEL}, headers=headers)
    assert named.status_code == 400 and named.json()["error"]["status"] == "INVALID_ARGUMENT"
    anonymous = httpx.post(url, json=BODY, headers={"x-goog-api-key": "AIza-not-a-token"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["status"] == "UNAUTHENTICATED"
    unknown = httpx.post(f"{fake.url}{MODELS}/{MODEL}:embedContent", json=BODY, headers=headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    assert fake.stats()["served"] == 0
