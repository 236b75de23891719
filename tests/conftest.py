"""Fixtures for the whole suite: real Redis servers started by the test session.

Nothing here ever connects to a Redis the session did not start (the one on 6379, if
any, is left alone): every server listens on a free 127.0.0.1 port, in a temp dir, with
``--save "" --appendonly no``.

* ``redis_url`` (function): ``redis://127.0.0.1:<port>`` of one redis-server shared by
  the session (started on first use, stopped at the end), FLUSHALLed before each test.
* ``redis_server`` (session): that server as a ``support.redis_server.RedisServer``.
* ``redis_cluster_url`` (function): a URL of one node of a 3-master Redis Cluster (no
  replicas, all slots covered), started only when a test asks for it, every master
  FLUSHALLed before each test. A plain ``redis://`` URL: use a cluster client
  (``redis.asyncio.cluster.RedisCluster.from_url``); ``proxy.limiter`` detects it.
* ``redis_cluster`` (session): that cluster as ``support.redis_server.RedisClusterServers``.
* ``disposable_redis`` (function): a private, running ``RedisServer`` for a test that
  stops, kills or restarts it (``.stop()``, ``.kill()``, ``.start()`` keeps the port).
* ``tls_redis`` (session) / ``tls_redis_url`` (function, FLUSHALLed): a redis-server
  with TLS (a test CA's certificate) and the ACL user ``llmproxy`` that may run only
  the proxy's commands on its keys (``proxy.limiter.redis.acl``); the ``rediss://`` URL logs
  in as that user and trusts only that CA (``support.redis_server.TlsRedisServer``).
* ``sentinel_group`` (function): a private primary, replica and three sentinels
  (``support.redis_server.SentinelGroup``), for tests that fail the primary over.
* ``limiter_url`` (function, parametrized): ``""`` (the in-memory limiter), then the
  session's Redis (``redis_url``): ``{"redis": {"url": limiter_url}}`` runs a test on both.
* ``serving_path`` (module, parametrized): the proxies a module starts run the fast
  paths (the lean upstream transport, replies written by the proxy's own protocol), then
  the portable ones (the general transport, the ASGI cycle): its tests run against both
  (the portable run is marked slow: ``make test-fast`` serves the fast paths only).

Every test under ``tests/e2e`` is marked slow (real processes on real clocks): ``make
test-fast`` leaves the end-to-end scenarios to ``make test``, which runs them first.

Tests using these are skipped when ``redis-server``/``redis-cli`` are not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from support.proxy_server import ProxyInThread
from support.redis_server import (
    TLS_PASSWORD,
    TLS_USER,
    RedisClusterServers,
    RedisServer,
    SentinelGroup,
    TlsRedisServer,
    redis_available,
)
from support.tls import CertificateAuthority, openssl_available

from proxy.upstream.client import create_transport


def _require_redis() -> None:
    if not redis_available():
        pytest.skip("redis-server and redis-cli are needed")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if not redis_server.running:  # a test stopped it: bring it back
        redis_server.start()
    redis_server.flush()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    _require_redis()
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServers) -> str:
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedisServer]:
    _require_redis()
    if not openssl_available():
        pytest.skip("openssl is needed to make the test CA")
    ca = CertificateAuthority.make(tmp_path_factory.mktemp("redis-ca"))
    server = TlsRedisServer(tmp_path_factory.mktemp("redis-tls"), ca, TLS_USER, TLS_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def tls_redis_url(tls_redis: TlsRedisServer) -> str:
    tls_redis.flush()
    return tls_redis.tls_url(TLS_USER, TLS_PASSWORD, tls_redis.ca.ca)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A private Sentinel-managed primary (one replica, three sentinels), started for
    this test (a failover test leaves it changed)."""
    _require_redis()
    group = SentinelGroup(tmp_path / "sentinel").start()
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def disposable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    _require_redis()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every end-to-end test is slow, and runs first: the longest tests started early
    leave no worker of ``make test`` waiting alone on one at the end (each module's
    tests stay together, in their order)."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: E2E not in item.path.parents)


@pytest.fixture(params=["memory", "redis"])
def limiter_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return ""
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture(scope="module", params=["fast", pytest.param("portable", marks=pytest.mark.slow)])
def serving_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every proxy this module starts (``ProxyInThread``) takes these paths. ``fast``, as
    the CLI serves: the lean transport for upstreams without an egress proxy, and replies
    written by the proxy's own HTTP protocol (``api/direct.py``). ``portable``: the
    general transport for every upstream (``create_transport``) and every reply through
    the ASGI cycle under uvicorn's stock protocol. A module that asks for it runs its
    tests against both."""
    fast = request.param == "fast"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("proxy.process.app.create_transport", partial(create_transport, lean=fast))
        if not fast:
            patch.setattr(ProxyInThread, "http", "auto")
        yield request.param
