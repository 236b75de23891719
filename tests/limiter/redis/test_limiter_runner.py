"""How the script runner names its Redis in logs (the eviction warning, say)."""

from __future__ import annotations

from proxy.limiter.redis.runner import ScriptRunner


def test_its_redis_is_named_without_user_password_or_query() -> None:
    """A query may carry the password too (``?password=``): it is left out with the rest."""
    url = "rediss://proxy:s3cret@redis.internal:6380/0?password=s3cret&ssl_ca_certs=/ca.pem"
    assert ScriptRunner(url).where == "rediss://redis.internal:6380/0"


def test_a_unix_socket_is_named_by_its_path() -> None:
    assert ScriptRunner("unix:///run/redis.sock?db=1").where == "unix:///run/redis.sock"
