"""Client keys of the admin API across real replicas: two ``llm-proxy serve`` processes
on one Redis in front of the real fake upstream. A key created on A answers on B within a
second; revoked on B, 401 on A within a second; rotated, both secrets work during the
grace period and only the new one after; a restart keeps the keys; the secret appears in
no log, metric, error or admin state. Without Redis, several workers refuse the API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ADMIN = {"authorization": "Bearer admin-secret-key"}
PROPAGATION = 1.0  # the promise: every replica within a second


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, redis_url: str = "") -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "admin": {"keys": ["admin-secret-key"]},
        "keys": [{"name": "config-team", "key": "sk-config-team"}],
        "models": [
            {"name": "gpt-4o-mini", "deployments": [{"id": "a", "base_url": upstream.base_url}]}
        ],
    }


def _status(proxy: ProxyProcess, secret: str) -> int:
    return httpx.post(
        f"{proxy.base_url}/chat/completions",
        headers={"authorization": f"Bearer {secret}"},
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    ).status_code


def _within(seconds: float, proxy: ProxyProcess, secret: str, status: int) -> float:
    """How long until ``secret`` gets ``status`` from ``proxy``; fails past ``seconds``."""
    start = time.monotonic()
    while (got := _status(proxy, secret)) != status:
        elapsed = time.monotonic() - start
        assert elapsed < seconds, f"still {got} after {elapsed:.2f} s"
    return time.monotonic() - start


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own (not the session's shared one): every test here
    creates a key named ``svc``, and a CI run found it already there after the shared
    server's FLUSHALL (written back by a replica of another test that saw the flush as a
    lost store and was still alive: not explained further)."""
    with RedisServer(tmp_path / "redis") as server:
        yield server.url


@pytest.fixture
def replicas(
    upstream: FakeUpstreamHandle, redis_url: str, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    with ExitStack() as stack:
        config = _config(upstream, redis_url)
        a, b = start_together(stack, [ProxyProcess(config, tmp_path, name=name) for name in "ab"])
        yield a, b


def test_created_on_one_replica_works_on_the_other_and_revoked_stops_everywhere(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    a, b = replicas
    created = httpx.post(f"{a.url}/admin/keys", headers=ADMIN, json={"name": "svc", "rpm": 100})
    assert created.status_code == 201, created.text
    secret = created.json()["key"]
    assert _status(a, secret) == 200  # at once where it was created
    _within(PROPAGATION, b, secret, 200)
    listed = httpx.get(f"{b.url}/admin/keys", headers=ADMIN).json()["keys"]
    assert [k["source"] for k in listed if k["name"] == "svc"] == ["api"]

    assert httpx.delete(f"{b.url}/admin/keys/svc", headers=ADMIN).status_code == 204
    assert _status(b, secret) == 401
    _within(PROPAGATION, a, secret, 401)

    for proxy in (a, b):
        assert secret not in proxy.logs()
        assert secret not in httpx.get(f"{proxy.url}/metrics").text
        assert secret not in httpx.get(f"{proxy.url}/admin/state", headers=ADMIN).text
        assert secret not in httpx.get(f"{proxy.url}/admin/keys", headers=ADMIN).text


def test_a_rotated_key_works_with_both_secrets_during_its_grace_then_only_the_new(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    a, b = replicas
    old = httpx.post(f"{a.url}/admin/keys", headers=ADMIN, json={"name": "svc"}).json()["key"]
    _within(PROPAGATION, b, old, 200)
    rotated = httpx.post(f"{a.url}/admin/keys/svc/rotate", headers=ADMIN, json={"grace": "3s"})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["key"]
    _within(PROPAGATION, b, new, 200)
    assert _status(b, old) == 200 and _status(a, old) == 200  # within its grace
    # The grace is 3 s from the rotation: the old secret stops then, on both replicas.
    _within(3 + PROPAGATION, b, old, 401)
    assert _status(a, old) == 401
    assert _status(a, new) == 200 and _status(b, new) == 200
    assert old not in a.logs() + b.logs() and new not in a.logs() + b.logs()


def test_a_restart_keeps_the_keys_of_the_api(
    upstream: FakeUpstreamHandle, redis_url: str, tmp_path: Path
) -> None:
    config = _config(upstream, redis_url)
    with ProxyProcess(config, tmp_path, name="first") as first:
        created = httpx.post(f"{first.url}/admin/keys", headers=ADMIN, json={"name": "svc"})
        secret = created.json()["key"]
        assert _status(first, secret) == 200
    with ProxyProcess(config, tmp_path, name="second") as second:
        assert _status(second, secret) == 200  # ready means loaded


def test_several_workers_without_redis_refuse_keys_by_api(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    with ProxyProcess(_config(upstream), tmp_path, workers=2) as proxy:
        refused = httpx.post(f"{proxy.url}/admin/keys", headers=ADMIN, json={"name": "svc"})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "runtime_keys_unavailable"
        assert "redis.url" in refused.json()["error"]["message"]
        assert _status(proxy, "sk-config-team") == 200
        assert "Run-time client keys (/admin/keys) are off: 2 workers, no redis.url" in proxy.logs()


def test_one_process_without_redis_says_its_keys_are_lost_on_restart(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    with ProxyProcess(_config(upstream), tmp_path) as proxy:
        created = httpx.post(f"{proxy.url}/admin/keys", headers=ADMIN, json={"name": "svc"})
        assert created.status_code == 201
        assert _status(proxy, created.json()["key"]) == 200
        assert "live in this process (no redis.url): they are lost on restart" in proxy.logs()


def test_with_redis_every_worker_of_a_replica_knows_a_new_key_within_a_second(
    upstream: FakeUpstreamHandle, redis_url: str, tmp_path: Path
) -> None:
    with ProxyProcess(_config(upstream, redis_url), tmp_path, workers=2) as proxy:
        created = httpx.post(f"{proxy.url}/admin/keys", headers=ADMIN, json={"name": "svc"})
        assert created.status_code == 201, created.text
        secret = created.json()["key"]
        # Each request is a new connection, which the kernel hands to either worker: 20
        # answers of 200 in a row, within the promise and the time they take, means both.
        deadline = time.monotonic() + PROPAGATION + 2.0
        streak = 0
        while streak < 20:
            assert time.monotonic() < deadline, f"only {streak} answers of 200 in a row"
            streak = streak + 1 if _status(proxy, secret) == 200 else 0
