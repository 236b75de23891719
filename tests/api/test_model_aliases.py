"""Model aliases and pattern groups as a user sees them: the official anthropic and openai
SDKs against a real proxy process in front of the fake upstream. An alias is served by
its group (the upstream sent the deployment's ``model:``, else the group's name); a name
a pattern serves goes upstream as asked unless the deployment names a model; exact names
beat patterns, the longest pattern the shorter; metrics count by the group, never the
client's string; the request's log line says both; allow-lists and windows count by the
group; ``/v1/models`` lists names and aliases, never a pattern."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from support.proxy_server import ProxyProcess

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

UPSTREAM_KEY = "sk-upstream-aliases"
CLIENT = "sk-client-aliases"
PATTERN_ONLY = "sk-client-pattern-only"
METERED = "sk-client-metered"
HI: list[Any] = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    config = FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY, chunk_delay=0.001)
    with run_in_thread(config) as handle:
        yield handle


def _anthropic(upstream: FakeUpstreamHandle, id_: str, model: str | None) -> dict[str, Any]:
    deployment = {
        "id": id_,
        "provider": "anthropic",
        "base_url": upstream.url,
        "api_key": UPSTREAM_KEY,
    }
    return deployment if model is None else {**deployment, "model": model}


def _config(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    openai_deployment = {"base_url": upstream.base_url, "api_key": UPSTREAM_KEY}
    return {
        "keys": [
            {"name": "app", "key": CLIENT},
            {"name": "pattern-only", "key": PATTERN_ONLY, "models": ["claude-*"]},
            {
                "name": "metered",
                "key": METERED,
                "limits": [{"requests": 2, "per": "1m", "models": ["claude-*"]}],
            },
        ],
        "models": [
            {
                "name": "claude-sonnet",
                "aliases": ["claude-sonnet-4-5", "claude-opus-4-8[1m]"],
                "deployments": [_anthropic(upstream, "sonnet-main", "claude-sonnet-upstream")],
            },
            {"name": "claude-*", "deployments": [_anthropic(upstream, "claude-any", None)]},
            {
                "name": "claude-opus-*",
                "deployments": [_anthropic(upstream, "opus-main", "claude-opus-upstream")],
            },
            {
                "name": "gpt-4o",
                "aliases": ["gpt4"],
                "deployments": [{**openai_deployment, "id": "gpt-4o-main"}],
            },
            {"name": "gpt-4o*", "deployments": [{**openai_deployment, "id": "gpt-4o-any"}]},
        ],
        "routing": {"retries": 0},
    }


@pytest.fixture(scope="module")
def proxy(
    upstream: FakeUpstreamHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    with ProxyProcess(_config(upstream), tmp_path_factory.mktemp("aliases")) as server:
        yield server


def _claude(proxy: ProxyProcess, key: str = CLIENT) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)


def _sent(upstream: FakeUpstreamHandle) -> str:
    """The model the upstream was asked for last."""
    last = upstream.stats()["last_request"]
    assert last is not None
    model = last["model"]
    assert isinstance(model, str)
    return model


def _log_lines(proxy: ProxyProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proxy.logs().splitlines() if '"request_id"' in line]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("asked", "group", "upstream_model"),
    [
        # An alias: its group's deployment, which names its model.
        ("claude-opus-4-8[1m]", "claude-sonnet", "claude-sonnet-upstream"),
        ("claude-sonnet-4-5", "claude-sonnet", "claude-sonnet-upstream"),
        # A pattern's name: sent as asked (its deployment names no model).
        ("claude-haiku-4-5-20251001", "claude-*", "claude-haiku-4-5-20251001"),
        # The longest pattern wins, and its deployment names its model.
        ("claude-opus-4-1", "claude-opus-*", "claude-opus-upstream"),
    ],
)
def test_the_anthropic_sdk_is_served_through_an_alias_or_a_pattern(
    proxy: ProxyProcess,
    upstream: FakeUpstreamHandle,
    asked: str,
    group: str,
    upstream_model: str,
) -> None:
    message = _claude(proxy).messages.create(model=asked, max_tokens=50, messages=HI)
    assert message.content  # served
    assert _sent(upstream) == upstream_model
    with _claude(proxy).messages.stream(model=asked, max_tokens=50, messages=HI) as stream:
        assert "".join(stream.text_stream)
    assert _sent(upstream) == upstream_model


@pytest.mark.parametrize(
    ("asked", "upstream_model"),
    [
        ("gpt4", "gpt-4o"),  # an alias of a group whose deployment names no model: its name
        ("gpt-4o", "gpt-4o"),  # exact beats the pattern gpt-4o* that matches it too
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini-2024-07-18"),  # the pattern: as asked
    ],
)
def test_the_openai_sdk_is_served_through_an_alias_or_a_pattern(
    proxy: ProxyProcess, upstream: FakeUpstreamHandle, asked: str, upstream_model: str
) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=CLIENT, max_retries=0)
    completion = client.chat.completions.create(model=asked, messages=HI)
    assert completion.choices[0].message.content
    assert _sent(upstream) == upstream_model
    chunks = client.chat.completions.create(model=asked, messages=HI, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert _sent(upstream) == upstream_model


def test_an_unknown_name_is_404_in_each_apis_shape(proxy: ProxyProcess) -> None:
    with pytest.raises(anthropic.NotFoundError):
        _claude(proxy).messages.create(model="gemini-2.5-pro", max_tokens=50, messages=HI)
    client = openai.OpenAI(base_url=proxy.base_url, api_key=CLIENT, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=HI)  # gpt-4o* needs the o


def test_an_upstreams_404_of_a_name_asked_for_is_the_clients_answer(
    proxy: ProxyProcess, upstream: FakeUpstreamHandle
) -> None:
    """A pattern group's deployment sends the client's name: Anthropic's 404
    (``not_found_error``) is then about that name, passed on, and the deployment stays
    healthy (a deployment cooled for any name a client makes up could be taken out by
    anyone)."""
    client = _claude(proxy)
    upstream.control(fail_rate=1.0, fail_status=404)
    try:
        for _ in range(4):
            with pytest.raises(anthropic.NotFoundError) as raised:
                client.messages.create(model="claude-made-up", max_tokens=50, messages=HI)
            assert raised.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    finally:
        upstream.control(fail_rate=0.0, fail_status=500)
    assert client.messages.create(model="claude-haiku-4-5", max_tokens=50, messages=HI).content


def test_an_allow_list_of_a_pattern_group_allows_every_name_it_serves(
    proxy: ProxyProcess,
) -> None:
    client = _claude(proxy, PATTERN_ONLY)
    assert client.messages.create(model="claude-haiku-4-5", max_tokens=50, messages=HI).content
    with pytest.raises(anthropic.PermissionDeniedError):  # claude-sonnet's alias: not allowed
        client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=HI)
    with pytest.raises(anthropic.PermissionDeniedError):  # the longer pattern's: another group
        client.messages.create(model="claude-opus-4-1", max_tokens=50, messages=HI)


def test_a_window_of_a_pattern_group_counts_every_name_it_serves(proxy: ProxyProcess) -> None:
    """The key's window over ``claude-*`` holds 2 requests: two different names the
    pattern serves spend it; an alias of another group is not counted there."""
    client = _claude(proxy, METERED)
    for asked in ("claude-haiku-4-5", "claude-3-7-sonnet-latest"):
        assert client.messages.create(model=asked, max_tokens=50, messages=HI).content
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="claude-instant-1", max_tokens=50, messages=HI)
    assert client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=HI).content


def test_v1_models_lists_names_and_aliases_never_a_pattern(proxy: ProxyProcess) -> None:
    listed = openai.OpenAI(base_url=proxy.base_url, api_key=CLIENT).models.list()
    assert [m.id for m in listed.data] == [
        "claude-sonnet",
        "claude-sonnet-4-5",
        "claude-opus-4-8[1m]",
        "gpt-4o",
        "gpt4",
    ]
    pattern_only = httpx.get(
        f"{proxy.base_url}/models", headers={"x-api-key": PATTERN_ONLY}, timeout=10
    )
    assert pattern_only.json()["data"] == []  # its one group is a pattern: nothing to list
    # One name is answered if a request may send it: an alias, a name a pattern serves.
    for name, status in [("claude-opus-4-8[1m]", 200), ("claude-haiku-4-5", 200), ("x", 404)]:
        one = httpx.get(
            f"{proxy.base_url}/models/{name}", headers={"x-api-key": CLIENT}, timeout=10
        )
        assert one.status_code == status, name
        if status == 200:
            assert one.json()["id"] == name


@pytest.mark.slow
def test_metrics_count_by_the_group_and_the_log_line_says_both(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    asked = ["claude-opus-4-8[1m]", "claude-haiku-4-5-20251001", "claude-haiku-4-5-20251001"]
    with ProxyProcess(_config(upstream), tmp_path) as proxy:
        client = _claude(proxy)
        for model in asked:
            client.messages.create(model=model, max_tokens=50, messages=HI)
        metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    served = [line for line in _log_lines(proxy) if line.get("status") == 200]
    assert [(line["model"], line["requested_model"]) for line in served] == [
        ("claude-sonnet", "claude-opus-4-8[1m]"),
        ("claude-*", "claude-haiku-4-5-20251001"),
        ("claude-*", "claude-haiku-4-5-20251001"),
    ]
    requests = [
        line for line in metrics.splitlines() if line.startswith("llmproxy_requests_total{")
    ]
    assert any('model="claude-*"' in line and line.endswith(" 2.0") for line in requests)
    assert any('model="claude-sonnet"' in line and line.endswith(" 1.0") for line in requests)
    assert 'deployment="claude-any"' in metrics
    for name in ("claude-haiku-4-5", "claude-opus-4-8"):  # never a label
        assert name not in metrics
