"""``redis.sentinel``: the limiter reaches the primary its sentinels name, through a
real primary, replica and three sentinels (``sentinel_group``), and follows a failover."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.limits import rpm
from support.redis_server import SENTINEL_MASTER, SentinelGroup, redis_available
from support.tls import CertificateAuthority, openssl_available

from proxy.config.settings import SentinelConfig, parse_settings
from proxy.costs import estimate_cost
from proxy.limiter.base import KeyAsk, KeyLimits, StorageError
from proxy.limiter.factory import sentinel_target
from proxy.limiter.redis.backend import KEY_PREFIX, RedisLimiter
from proxy.process.startup import redis_problem

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

KEY = KeyLimits("team-a", windows=(rpm(600, 600),))
MINIMAL = {
    "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://127.0.0.1:1/v1"}]}]
}


def _limiter(group: SentinelGroup) -> RedisLimiter:
    config = SentinelConfig(master=SENTINEL_MASTER, nodes=group.nodes)
    return RedisLimiter(
        "",
        sentinel=sentinel_target(config),
        op_timeout=5.0,  # generous, as support.limits.patient: a busy machine's TLS
        socket_timeout=2.0,
        connect_timeout=2.0,
        leases=False,
    )


@pytest.mark.slow
async def test_budgets_live_on_the_primary_the_sentinels_name(
    sentinel_group: SentinelGroup,
) -> None:
    limiter = _limiter(sentinel_group)
    try:
        assert (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(0)))).allowed
    finally:
        await limiter.aclose()
    with sentinel_group.primary.client() as c:
        assert c.exists(f"{{{KEY_PREFIX}:k:team-a}}:rpm")


@pytest.mark.slow
async def test_a_failover_is_an_outage_then_the_new_primary_shares_budgets(
    sentinel_group: SentinelGroup,
) -> None:
    limiter = _limiter(sentinel_group)
    try:
        assert (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(0)))).allowed
        sentinel_group.primary.kill()
        with pytest.raises(StorageError):  # no primary yet: an outage (redis.on_error)
            await limiter.acquire_key(KeyAsk(KEY, "b", estimate_cost(0)))
        # Resumes once the sentinels have promoted the replica (a generous deadline).
        for _ in range(300):
            try:
                verdict = await limiter.acquire_key(KeyAsk(KEY, "c", estimate_cost(0)))
                break
            except StorageError:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("no call reached a new primary within 30 s")
        assert verdict.allowed
    finally:
        await limiter.aclose()
    assert sentinel_group.master_port() == sentinel_group.replica.port
    with sentinel_group.replica.client() as c:
        # The new primary holds the replicated window and this call's spend.
        assert c.exists(f"{{{KEY_PREFIX}:k:team-a}}:rpm")


@pytest.mark.slow
def test_the_primarys_user_and_the_sentinels_own_password(tmp_path: Path) -> None:
    """``username``/``password`` log in to the primary; ``sentinel_password`` to the
    sentinels (without it they get the primary's user, which they do not know: one
    start-up line)."""
    group = SentinelGroup(tmp_path, user=("proxy", "primary-pw"), sentinel_password="s-pw")
    group.start()
    try:
        sentinel = {
            "master": SENTINEL_MASTER,
            "nodes": group.nodes,
            "username": "proxy",
            "password": "primary-pw",
            "sentinel_password": "s-pw",
        }
        settings = parse_settings({**MINIMAL, "redis": {"sentinel": sentinel}}, env={})
        assert redis_problem(settings) is None
        config = settings.redis.sentinel
        assert config is not None

        async def acquire() -> bool:
            limiter = RedisLimiter("", sentinel=sentinel_target(config), op_timeout=5.0)
            try:
                return (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(0)))).allowed
            finally:
                await limiter.aclose()

        assert asyncio.run(acquire())
        with group.primary.client() as c:
            assert c.exists(f"{{{KEY_PREFIX}:k:team-a}}:rpm")

        without = {**sentinel, "sentinel_password": ""}
        settings = parse_settings({**MINIMAL, "redis": {"sentinel": without}}, env={})
        problem = redis_problem(settings)
        assert problem is not None and problem.startswith("redis.sentinel: sentinel 127.0.0.1:")
        assert "refused the user or password" in problem and "pw" not in problem
    finally:
        group.stop()


@pytest.mark.slow
def test_tls_to_the_sentinels_and_the_primary(tmp_path: Path) -> None:
    """``tls: {ca_file}``: the sentinels and the primary they name (its TLS port) are
    reached over TLS, trusting that CA; another CA is one start-up line."""
    if not openssl_available():
        pytest.skip("openssl is needed to make the test CA")
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority.make(tmp_path / "ca")
    group = SentinelGroup(tmp_path / "group", tls=ca)
    group.start()
    try:
        sentinel = {"master": SENTINEL_MASTER, "nodes": group.nodes, "tls": {"ca_file": str(ca.ca)}}
        settings = parse_settings({**MINIMAL, "redis": {"sentinel": sentinel}}, env={})
        assert redis_problem(settings) is None
        config = settings.redis.sentinel
        assert config is not None
        assert (
            asyncio.run(_acquire_once(RedisLimiter("", sentinel=sentinel_target(config)))) is True
        )
        with group.primary.client() as c:
            assert c.exists(f"{{{KEY_PREFIX}:k:team-a}}:rpm")

        (tmp_path / "other").mkdir()
        other = CertificateAuthority.make(tmp_path / "other")
        wrong = {**sentinel, "tls": {"ca_file": str(other.ca)}}
        problem = redis_problem(parse_settings({**MINIMAL, "redis": {"sentinel": wrong}}, env={}))
        assert problem is not None and "TLS certificate" in problem and "ca_file" in problem
    finally:
        group.stop()


async def _acquire_once(limiter: RedisLimiter) -> bool:
    try:
        return (await limiter.acquire_key(KeyAsk(KEY, "a", estimate_cost(0)))).allowed
    finally:
        await limiter.aclose()
