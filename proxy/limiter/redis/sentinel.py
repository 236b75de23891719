"""A Sentinel-managed primary as the limiter's Redis (``redis.sentinel``).

redis-py's Sentinel client asks the sentinels for the primary's address whenever it opens
a connection, and drops a connection whose server has become a replica (``READONLY``).
So a failover looks to the limiter like any Redis outage: calls fail (the policy falls
back to ``redis.on_error``) until the sentinels have promoted a replica, then the next
connection reaches the new primary and limiting is shared again. The batches travel on
redis-py's pipeline here, not on resp.py's own connection (which has one fixed address).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["SentinelTarget", "client_options", "open_primary"]


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where the sentinels are and how to authenticate to them and to the primary.
    ``tls``: redis-py's ``ssl_*`` connection options (empty: plain TCP)."""

    master: str
    nodes: tuple[tuple[str, int], ...]
    username: str = ""
    password: str = ""
    sentinel_password: str = ""  # empty: the sentinels take username and password too
    tls: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """For logs: the service and its sentinels, no secrets."""
        nodes = ", ".join(f"{host}:{port}" for host, port in self.nodes)
        return f"sentinel master {self.master!r} via {nodes}"


def open_primary(
    target: SentinelTarget, options: dict[str, Any], max_connections: int
) -> tuple[Redis, Sentinel]:
    """A client of ``target``'s current primary, and the sentinels' client (close both);
    ``options`` (timeouts, decoding) apply to the sentinels too, so finding the primary
    is as quickly given up as a call."""
    sentinel_kwargs, primary_kwargs = client_options(target, options)
    sentinels = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.nodes), sentinel_kwargs=sentinel_kwargs, **primary_kwargs
    )
    primary = sentinels.master_for(target.master, max_connections=max_connections)
    return primary, sentinels


def client_options(
    target: SentinelTarget, options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """redis-py's options for the sentinels and for the primary (its asyncio and its
    blocking Sentinel take the same)."""
    fail_fast = Retry(NoBackoff(), 0)  # the circuit breaker decides, and scripts never re-run
    primary_auth = {
        "username": target.username or None,
        "password": target.password or None,
    }
    sentinel_auth = (
        {"password": target.sentinel_password} if target.sentinel_password else primary_auth
    )
    common = {**options, **target.tls, "retry": fail_fast}
    return {**common, **sentinel_auth}, {**common, **primary_auth}
