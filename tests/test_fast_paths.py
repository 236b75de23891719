"""Every fast path has a switch: ``LLM_PROXY_WITHOUT`` names those turned off, and a
proxy with all of them off serves as the contract says, through the CLI, on Redis and
with two workers (the general pieces each one replaces)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from support.proxy_server import ProxyProcess

from proxy.config import fast_paths
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread


def test_every_fast_path_is_on_unless_named() -> None:
    assert fast_paths.disabled({}) == frozenset()
    assert all(fast_paths.enabled(name, {}) for name in fast_paths.FAST_PATHS)


def test_named_paths_are_off_and_all_turns_off_every_one() -> None:
    env = {fast_paths.ENV: " Lean, leases ,"}
    assert fast_paths.disabled(env) == {"lean", "leases"}
    assert not fast_paths.enabled("lean", env) and fast_paths.enabled("protocol", env)
    assert fast_paths.disabled({fast_paths.ENV: "all"}) == set(fast_paths.FAST_PATHS)


def test_the_fast_paths_are_the_remaining_switches() -> None:
    """Any other name (one of a fast path removed, issue 52) is unknown: an error below."""
    assert set(fast_paths.FAST_PATHS) == {
        "protocol",
        "lean",
        "leases",
    }


def test_an_unknown_name_is_an_error_naming_the_variable_and_the_names() -> None:
    with pytest.raises(ValueError, match="LLM_PROXY_WITHOUT: unknown fast path 'turbo'"):
        fast_paths.disabled({fast_paths.ENV: "lean,turbo"})
    with pytest.raises(KeyError):
        fast_paths.enabled("turbo", {})


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, redis_url: str) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "team", "key": "sk-team", "rpm": 1000}],
        "models": [
            {
                "name": "gpt-4o-mini",
                "deployments": [{"id": "a", "base_url": upstream.base_url, "rpm": 6000}],
            }
        ],
    }


@pytest.mark.slow
def test_a_proxy_without_any_fast_path_serves_plain_and_streamed(
    upstream: FakeUpstreamHandle, redis_url: str, tmp_path: Path
) -> None:
    env = {fast_paths.ENV: "all"}
    with ProxyProcess(_config(upstream, redis_url), tmp_path, workers=2, env=env) as proxy:
        client = OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-team", max_retries=0)
        messages: Any = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=messages
            )
            assert raw.http_response.status_code == 200
            assert raw.headers["x-ratelimit-limit-requests"] == "1000"
        chunks = list(
            client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
        )
        assert chunks and any(c.choices and c.choices[0].delta.content for c in chunks)


@pytest.mark.slow
def test_serve_refuses_an_unknown_fast_path_naming_it(
    upstream: FakeUpstreamHandle, redis_url: str, tmp_path: Path
) -> None:
    proxy = ProxyProcess(_config(upstream, redis_url), tmp_path, env={fast_paths.ENV: "turbo"})
    with pytest.raises(RuntimeError, match="LLM_PROXY_WITHOUT: unknown fast path 'turbo'"):
        proxy.start(timeout=15)
