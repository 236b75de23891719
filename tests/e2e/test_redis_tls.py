"""The proxy over a Redis as managed services run it: TLS (a test CA), an ACL user that
may run only the proxy's commands on its keys (``proxy.limiter.redis.acl``, the line
docs/production.md prints). It limits through it; a wrong CA or password stops
``llm-proxy serve`` with one line naming what to change."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.ports import free_port
from support.proxy_server import ProxyProcess
from support.redis_server import TLS_PASSWORD, TLS_USER, TlsRedisServer, redis_available
from support.tls import CertificateAuthority
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.limiter.redis.acl import setuser_line
from proxy.limiter.redis.backend import KEY_PREFIX

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-tls"


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(url: str, upstream: FakeUpstreamHandle) -> dict[str, Any]:
    return {
        "redis": {"url": url, "on_error": "reject", "timeout": "1s"},
        "keys": [{"name": "k", "key": KEY, "rpm": 3}],
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url}]}],
    }


def test_the_proxy_limits_through_tls_as_the_acl_user(
    tmp_path: Path, tls_redis: TlsRedisServer, tls_redis_url: str, upstream: FakeUpstreamHandle
) -> None:
    # on_error: reject, so an answer that is not 503 came from the Redis over TLS.
    with ProxyProcess(_config(tls_redis_url, upstream), tmp_path) as proxy:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        statuses = [
            httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers).status_code
            for _ in range(4)
        ]
        # The user may not run CONFIG GET: said once, and nothing else failed.
        wait_until(lambda: "cannot read maxmemory-policy" in proxy.logs(), 10.0, "the note")
        logs = proxy.logs()
    assert statuses == [200, 200, 200, 429]  # the key's rpm: 3, shared in Redis
    assert logs.count("cannot read maxmemory-policy") == 1
    assert "limiter storage failed" not in logs
    with tls_redis.client() as c:
        assert c.exists(f"{{{KEY_PREFIX}:k:k}}:rpm")


def _serve(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLM_PROXY_")}
    argv = ["serve", "--config", str(path), "--port", str(free_port())]
    return subprocess.run(
        [sys.executable, "-m", "proxy", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=environment,
        cwd=ROOT,
    )


def test_a_wrong_password_is_one_start_up_line(
    tmp_path: Path, tls_redis: TlsRedisServer, upstream: FakeUpstreamHandle
) -> None:
    url = tls_redis.tls_url(TLS_USER, "not-the-password", tls_redis.ca.ca)
    result = _serve(_config(url, upstream), tmp_path)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "redis.url" in line and "refused the user or password" in line
    assert "not-the-password" not in line  # the URL's secret is never printed


def test_a_certificate_of_another_ca_is_one_start_up_line(
    tmp_path: Path, tls_redis: TlsRedisServer, upstream: FakeUpstreamHandle
) -> None:
    other = CertificateAuthority.make(tmp_path)
    url = tls_redis.tls_url(TLS_USER, TLS_PASSWORD, other.ca)
    result = _serve(_config(url, upstream), tmp_path)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "TLS certificate" in line and "not trusted" in line and "ssl_ca_certs" in line
    assert TLS_PASSWORD not in line


def test_docs_production_prints_the_acl_line_the_tests_run_with() -> None:
    text = (ROOT / "docs" / "production.md").read_text()
    assert setuser_line("llmproxy", "<password>") in text
