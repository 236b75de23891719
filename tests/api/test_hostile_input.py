"""Hostile and malformed input never gets a 5xx: every field the proxy reads is checked
(a 400 naming it), nested content is walked without recursion, and random JSON of every
shape thrown at every endpoint through the real proxy gets an OpenAI-shaped answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ENDPOINTS = ("/chat/completions", "/completions", "/embeddings")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, stream_chunks=2)) as handle:
        yield handle


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    deployment = {"id": "d", "base_url": upstream.base_url, "tpm": 10_000_000}
    config = {"models": [{"name": "m", "deployments": [deployment]}]}
    with ProxyInThread(settings_from(config)) as server:
        yield server


@pytest.fixture(scope="module")
def http(proxy: ProxyInThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        yield client


def _assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("stream_options", "x", "stream_options"),
        ("stream_options", [1], "stream_options"),
        ("stream_options", 5, "stream_options"),
        ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
        ("stream", "true", "stream"),
        ("max_tokens", "10", "max_tokens"),
        ("max_tokens", -1, "max_tokens"),
        ("max_tokens", True, "max_tokens"),
        ("max_completion_tokens", 1.5, "max_completion_tokens"),
        ("n", 0, "n"),
        ("messages", "hi", "messages"),
        ("messages", [1], "messages[0]"),
    ],
)
def test_a_field_the_proxy_reads_with_the_wrong_shape_is_a_400_naming_it(
    http: httpx.Client, field: str, value: Any, param: str
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = http.post("/chat/completions", json={**body, field: value})
    error = _assert_openai_error(response, 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [300, 900])
def test_content_nested_hundreds_of_levels_deep_is_no_500(http: httpx.Client, depth: int) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": _nested(depth)}]}
    embedding = {"model": "m", "input": _nested(depth)}
    for path, body in (("/chat/completions", chat), ("/embeddings", embedding)):
        response = http.post(path, json=body)
        assert response.status_code < 500, response.text


# -- any JSON at all -----------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "messages": json_values
        | st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": json_values}), max_size=3
        ),
        "prompt": json_values,
        "input": json_values,
        "stream": json_values,
        "stream_options": json_values,
        "max_tokens": json_values,
        "max_completion_tokens": json_values,
        "n": json_values,
        "temperature": json_values,
    },
)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(endpoint=st.sampled_from(ENDPOINTS), body=fields | json_values)
def test_random_json_at_every_endpoint_never_gets_a_5xx(
    http: httpx.Client, endpoint: str, body: Any
) -> None:
    response = http.post(endpoint, json=body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        _assert_openai_error(response, response.status_code)
    elif isinstance(body, dict) and body.get("stream") is True:
        assert response.text.rstrip().endswith("data: [DONE]")
