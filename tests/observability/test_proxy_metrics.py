"""Metrics and logs of a real proxy process: right numbers across workers, no secrets."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.proxy_server import ProxyProcess, free_port

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

CLIENT_KEY = "sk-client-SECRET-1d9f"
WRONG_KEY = "sk-wrong-SECRET-77aa"
UPSTREAM_KEY = "sk-upstream-SECRET-42c0"
PROMPT = "PROMPT-MARKER-do-not-log-me"


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, api_key=UPSTREAM_KEY)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "keys": [{"name": "team-a", "key": CLIENT_KEY}],
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "good", "base_url": upstream.base_url, "api_key": UPSTREAM_KEY},
                ],
            },
            {
                "name": "broken",
                "deployments": [
                    {
                        "id": "refused",
                        "base_url": f"http://127.0.0.1:{free_port()}/v1",
                        "api_key": UPSTREAM_KEY,
                    }
                ],
            },
        ],
        "routing": {"retries": 0},
    }


def _chat(client: httpx.Client, url: str, model: str = "m", key: str = CLIENT_KEY) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
    response = client.post(
        f"{url}/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    return response.status_code


def _sum(metrics: str, name: str) -> float:
    pattern = re.compile(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(metrics))


@pytest.mark.slow
def test_counters_over_two_workers_equal_the_requests_sent(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    sent = {200: 0, 404: 0, 401: 0}
    with (
        ProxyProcess(_config(upstream), tmp_path, workers=2) as proxy,
        httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as client,
    ):
        # Fresh connections so uvicorn spreads them over both workers.
        for i in range(60):
            if i % 6 == 0:
                status = _chat(client, proxy.base_url, model="nope")
            elif i % 6 == 1:
                status = _chat(client, proxy.base_url, key=WRONG_KEY)
            else:
                status = _chat(client, proxy.base_url)
            sent[status] += 1
        metrics = client.get(f"{proxy.url}/metrics").text
    assert sent == {200: 40, 404: 10, 401: 10}
    assert _sum(metrics, "llmproxy_requests_total") == 60
    assert _sum(metrics, "llmproxy_upstream_requests_total") == 40
    assert re.search(r'llmproxy_requests_total\{[^}]*status="404"[^}]*\} 10\.0', metrics)


@pytest.mark.slow
def test_no_key_or_prompt_appears_in_logs_or_metrics(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    with ProxyProcess(_config(upstream), tmp_path) as proxy, httpx.Client(timeout=10) as client:
        statuses = [_chat(client, proxy.base_url) for _ in range(3)]
        statuses.append(_chat(client, proxy.base_url, key=WRONG_KEY))
        statuses.append(_chat(client, proxy.base_url, model="broken"))
        upstream.control(fail_rate=1.0)
        statuses.append(_chat(client, proxy.base_url))
        upstream.control(fail_rate=0.0, api_key="another-key")  # the upstream rejects ours
        statuses.append(_chat(client, proxy.base_url))
        client.post(
            f"{proxy.base_url}/chat/completions",
            content=b"{broken json " + PROMPT.encode(),
            headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
        )
        metrics = client.get(f"{proxy.url}/metrics").text
    logs = proxy.logs()
    assert statuses == [200, 200, 200, 401, 502, 502, 502]
    assert '"request_id"' in logs  # request lines were written
    for secret in (CLIENT_KEY, WRONG_KEY, UPSTREAM_KEY, PROMPT, "SECRET"):
        assert secret not in logs, secret
        assert secret not in metrics, secret


@pytest.mark.slow
def test_an_unknown_models_log_line_names_the_model_asked_for(
    tmp_path: Path, upstream: FakeUpstreamHandle
) -> None:
    """What the operator must configure is in the request's log line (``requested_model``,
    bounded, control characters escaped: a client cannot forge a line), never in a metric
    label (``model`` stays the configured name, ``unknown``)."""
    asked = ["gpt-5-turbo", 'gpt-6\n{"level": "error"}\x1b[2J', "x" * 5000]
    with ProxyProcess(_config(upstream), tmp_path) as proxy, httpx.Client(timeout=10) as client:
        statuses = [_chat(client, proxy.base_url, model=model) for model in asked]
        metrics = client.get(f"{proxy.url}/metrics").text
    assert statuses == [404, 404, 404]
    lines = [json.loads(line) for line in proxy.logs().splitlines() if '"request_id"' in line]
    logged = [line for line in lines if line.get("status") == 404]
    assert [line["model"] for line in logged] == ["unknown"] * 3
    assert [line["requested_model"] for line in logged] == [
        "gpt-5-turbo",
        'gpt-6\\n{"level": "error"}\\x1b[2J',
        "x" * 200 + "...",
    ]
    for model in ("gpt-5", "gpt-6", "xxxx"):
        assert model not in metrics
    assert 'model="unknown"' in metrics
