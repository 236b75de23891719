"""Building the limiter a process needs: in memory without Redis, or the Redis limiter
behind the fail-open/fail-closed policy. Call ``await limiter.start()`` at start-up and
``await limiter.aclose()`` at shutdown."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from proxy.config import fast_paths
from proxy.config.settings import SentinelConfig, TlsConfig
from proxy.limiter.base import ManagedLimiter
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.policy import OnError, ResilientLimiter
from proxy.limiter.redis.backend import RedisLimiter
from proxy.limiter.redis.sentinel import SentinelTarget

__all__ = ["create_limiter", "default_replica_id", "sentinel_target"]


def create_limiter(
    redis_url: str | None,
    on_error: str = "local",
    replica_id: str = "",
    *,
    timeout: float | None = None,
    socket_timeout: float = 0.1,
    connect_timeout: float = 0.1,
    op_timeout: float = 0.25,
    max_connections: int = 64,
    heartbeat_interval: float = 1.0,
    replica_ttl: float = 3.0,
    failure_threshold: int = 3,
    reset_after: float = 1.0,
    sentinel: SentinelTarget | None = None,
) -> ManagedLimiter:
    """The limiter for one process.

    ``redis_url`` empty or None: a MemoryLimiter (budgets in this process; with N workers
    pass rates already divided by N). Otherwise a ResilientLimiter over a RedisLimiter
    (``redis+cluster://`` forces Redis Cluster, other URLs are probed with INFO cluster).
    ``on_error`` is ``"local"`` or ``"reject"``; ``replica_id`` must be unique per
    process, empty picks ``default_replica_id()``. ``timeout`` (the config's
    ``redis.timeout``), when given, replaces the three finer knobs: it bounds each socket
    step (connect, send, read), and three times it bounds a whole operation (which may
    wait for a pooled connection, connect, and reload a script after NOSCRIPT).
    ``sentinel``: the Redis is the primary its sentinels name (instead of ``redis_url``).
    """
    if not redis_url and sentinel is None:
        return MemoryLimiter()
    if on_error not in ("local", "reject"):
        raise ValueError(f"on_error must be 'local' or 'reject', not {on_error!r}")
    policy: OnError = "local" if on_error == "local" else "reject"
    if timeout is not None:
        socket_timeout = connect_timeout = timeout
        op_timeout = 3 * timeout
    shared = RedisLimiter(
        redis_url or "",
        sentinel=sentinel,
        socket_timeout=socket_timeout,
        connect_timeout=connect_timeout,
        op_timeout=op_timeout,
        max_connections=max_connections,
        leases=fast_paths.enabled("leases"),
    )
    return ResilientLimiter(
        shared,
        on_error=policy,
        replica_id=replica_id or default_replica_id(),
        heartbeat_interval=heartbeat_interval,
        replica_ttl=replica_ttl,
        failure_threshold=failure_threshold,
        reset_after=reset_after,
    )


def default_replica_id() -> str:
    """host:pid:random, unique per process even across container restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def sentinel_target(config: SentinelConfig) -> SentinelTarget:
    """The config's ``redis.sentinel`` as the runner takes it (redis-py's TLS options)."""
    return SentinelTarget(
        master=config.master,
        nodes=tuple(config.addresses()),
        username=config.username.get_secret_value(),
        password=config.password.get_secret_value(),
        sentinel_password=config.sentinel_password.get_secret_value(),
        tls=_tls_options(config.tls),
    )


def _tls_options(tls: bool | TlsConfig) -> dict[str, Any]:
    if tls is False:
        return {}
    if tls is True:
        return {"ssl": True}
    return {
        "ssl": True,
        "ssl_ca_certs": tls.ca_file or None,
        "ssl_certfile": tls.cert_file or None,
        "ssl_keyfile": tls.key_file or None,
        "ssl_cert_reqs": "required" if tls.verify else "none",
        "ssl_check_hostname": tls.verify,
    }
