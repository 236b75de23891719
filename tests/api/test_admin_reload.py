"""POST /admin/reload through a real proxy (in-memory limiter) and the real fake upstream:
a valid file is in force for the next request, requests already under way finish under
the old one, an invalid file changes nothing and answers 400 with every problem."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from support.proxy_server import ProxyInThread
from support.waiting import wait_until

from proxy.config.settings import load_settings
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ADMIN = "adm-secret"
OLD_KEY, NEW_KEY = "sk-old-key", "sk-new-key"


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(
    upstream: FakeUpstreamHandle, keys: list[dict[str, Any]], **deployment: Any
) -> dict[str, Any]:
    return {
        "keys": keys,
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "d1", "base_url": upstream.base_url, "api_key": "up", **deployment}
                ],
            }
        ],
        "routing": {"retries": 0, "max_wait": "10s"},
        "admin": {"keys": [ADMIN]},
    }


def _write(path: Path, config: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(config))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return tmp_path / "config.yaml"


def _proxy(config_file: Path, config: dict[str, Any]) -> ProxyInThread:
    _write(config_file, config)
    return ProxyInThread(load_settings(config_file), config_path=config_file)


def _reload(proxy: ProxyInThread, key: str | None = ADMIN) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{proxy.url}/admin/reload", headers=headers, timeout=10)


def _chat(proxy: ProxyInThread, key: str) -> str:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    return reply.choices[0].message.content or ""


def _reloads(proxy: ProxyInThread, result: str) -> float:
    for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
        if line.startswith(f'llmproxy_config_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    raise AssertionError("no llmproxy_config_reloads_total series")


def test_a_reload_rotates_a_key_for_the_very_next_request(
    upstream: FakeUpstreamHandle, config_file: Path
) -> None:
    with _proxy(config_file, _config(upstream, [{"name": "app", "key": OLD_KEY}])) as proxy:
        assert _chat(proxy, OLD_KEY)
        _write(config_file, _config(upstream, [{"name": "app", "key": NEW_KEY}]))
        response = _reload(proxy)
        assert response.status_code == 200
        summary = response.json()
        assert summary["reloaded"] is True
        assert summary["keys"] == {"added": [], "removed": [], "changed": ["app"]}
        assert OLD_KEY not in response.text and NEW_KEY not in response.text
        with pytest.raises(openai.AuthenticationError):
            _chat(proxy, OLD_KEY)
        assert _chat(proxy, NEW_KEY)
        assert _reloads(proxy, "success") == 1.0


def test_an_invalid_file_changes_nothing_and_answers_400_with_every_problem(
    upstream: FakeUpstreamHandle, config_file: Path
) -> None:
    with _proxy(config_file, _config(upstream, [{"name": "app", "key": OLD_KEY}])) as proxy:
        broken = _config(upstream, [{"name": "app", "key": NEW_KEY, "rpm": -1}])
        broken["routing"]["strategy"] = "fastest-please"
        _write(config_file, broken)
        response = _reload(proxy)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_config"
        assert "keys[0].rpm" in error["message"] and "routing.strategy" in error["message"]
        assert NEW_KEY not in response.text
        assert _chat(proxy, OLD_KEY)  # the config in force is the old one
        with pytest.raises(openai.AuthenticationError):
            _chat(proxy, NEW_KEY)
        assert _reloads(proxy, "failure") == 1.0
        assert _reloads(proxy, "success") == 0.0


def test_a_reload_needs_an_admin_key(upstream: FakeUpstreamHandle, config_file: Path) -> None:
    with _proxy(config_file, _config(upstream, [{"name": "app", "key": OLD_KEY}])) as proxy:
        assert _reload(proxy, key=None).status_code == 401
        assert _reload(proxy, key=OLD_KEY).status_code == 401  # a client key is not one
        assert _reloads(proxy, "success") == 0.0


def test_a_request_waiting_for_its_turn_finishes_under_the_config_it_started_with(
    upstream: FakeUpstreamHandle, config_file: Path
) -> None:
    # One request a second on d1: of two sent at once, the second waits for its turn.
    config = _config(upstream, [{"name": "app", "key": OLD_KEY}], rpm=60)
    with _proxy(config_file, config) as proxy:
        state: Any = proxy.app.state

        async def scenario() -> list[httpx.Response]:
            headers = {"authorization": f"Bearer {OLD_KEY}"}
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(timeout=30) as client:
                url = f"{proxy.base_url}/chat/completions"
                sent = [
                    asyncio.create_task(client.post(url, json=body, headers=headers))
                    for _ in range(2)
                ]
                await asyncio.to_thread(
                    wait_until, lambda: state.pipeline.waiting == 1, 10.0, "a request waiting"
                )
                # The key is removed and the deployment slowed while one request waits.
                _write(config_file, _config(upstream, [{"name": "app", "key": NEW_KEY}], rpm=6))
                assert (await asyncio.to_thread(_reload, proxy)).status_code == 200
                return list(await asyncio.gather(*sent))

        responses = asyncio.run(scenario())
        assert [r.status_code for r in responses] == [200, 200]
        with pytest.raises(openai.AuthenticationError):
            _chat(proxy, OLD_KEY)
        # The old pipeline is retired once its requests are done.
        wait_until(lambda: state.reloader.retiring == 0, 10.0, "old pipeline retired")


def test_a_reload_adds_and_removes_deployments_and_their_series(
    upstream: FakeUpstreamHandle, config_file: Path
) -> None:
    config = _config(upstream, [{"name": "app", "key": OLD_KEY}], rpm=600)
    with _proxy(config_file, config) as proxy:
        new = _config(upstream, [{"name": "app", "key": OLD_KEY}])
        new["models"][0]["deployments"] = [
            {"id": "d2", "base_url": upstream.base_url, "api_key": "up", "rpm": 300}
        ]
        _write(config_file, new)
        summary = _reload(proxy).json()
        assert summary["deployments"] == {"added": ["m/d2"], "removed": ["m/d1"], "changed": []}
        metrics = httpx.get(f"{proxy.url}/metrics").text
        assert 'llmproxy_deployment_limit{deployment="d2",kind="requests",model="m"} 300.0' in (
            metrics
        )
        assert 'llmproxy_deployment_state{deployment="d1"' not in metrics
        assert 'llmproxy_deployment_state{deployment="d2",model="m"} 0.0' in metrics
        assert _chat(proxy, OLD_KEY)
        ready = httpx.get(f"{proxy.url}/health/ready").json()
        assert ready["deployments_usable"] == 1


def test_what_needs_a_restart_is_reported_and_kept(
    upstream: FakeUpstreamHandle, config_file: Path
) -> None:
    config = _config(upstream, [{"name": "app", "key": OLD_KEY}])
    with _proxy(config_file, config) as proxy:
        config["server"] = {"header_timeout": "3s", "default_max_tokens": 64}
        _write(config_file, config)
        summary = _reload(proxy).json()
        assert summary["restart_needed"] == ["server.header_timeout"]
        assert summary["other"] == ["server"]  # default_max_tokens is applied
        settings = proxy.app.state.settings  # type: ignore[attr-defined]
        assert settings.server.header_timeout == 10.0
        assert settings.server.default_max_tokens == 64


def test_a_reload_that_would_leave_no_keys_is_refused_and_warned(
    upstream: FakeUpstreamHandle, config_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Losing every key (a bad edit, an unset variable) would open the proxy to anyone:
    refused with the contract's knob named, and the keys in force keep guarding it."""
    with _proxy(config_file, _config(upstream, [{"name": "app", "key": OLD_KEY}])) as proxy:
        _write(config_file, _config(upstream, []))
        with caplog.at_level("WARNING", logger="proxy.reload"):
            response = _reload(proxy)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_config" and "server.open_access" in error["message"]
        assert any(r.levelname == "WARNING" for r in caplog.records)
        anonymous = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert anonymous.status_code == 401
        assert _chat(proxy, OLD_KEY)
        assert _reloads(proxy, "failure") == 1.0


def test_a_reload_to_open_access_needs_the_file_to_say_so_and_is_warned(
    upstream: FakeUpstreamHandle, config_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _proxy(config_file, _config(upstream, [{"name": "app", "key": OLD_KEY}])) as proxy:
        opened = _config(upstream, [])
        opened["server"] = {"open_access": True}
        _write(config_file, opened)
        with caplog.at_level("WARNING", logger="proxy.reload"):
            response = _reload(proxy)
        assert response.status_code == 200
        assert any(
            r.levelname == "WARNING" and "open_access" in r.getMessage() for r in caplog.records
        )
        assert _chat(proxy, "any-key-at-all")
