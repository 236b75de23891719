"""The one pooled upstream transport per process.

httpx's transport API (``httpx.Request`` in, ``httpx.Response`` out) over aiohttp's
connection pool: measured on a 2-core machine, a minimal proxy served ~500 req/s with
httpx's default transport and ~1,860 with this one. The proxy calls the transport
directly rather than through ``httpx.AsyncClient``: it needs no cookies, redirects, auth
flows or URL merging, and skipping them was a quarter of the forwarding cost.
"""

from __future__ import annotations

import aiohttp
from httpx_aiohttp import AiohttpTransport

__all__ = ["create_transport", "timeout_extension"]


def create_transport(max_connections: int = 1000, keepalive: float = 30.0) -> AiohttpTransport:
    """The transport for all upstream calls; create it inside the running event loop."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=max_connections,
            limit_per_host=0,
            keepalive_timeout=keepalive,
            ttl_dns_cache=300,
        ),
        # Bodies pass through untouched; we ask upstreams for identity encoding anyway.
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    return AiohttpTransport(client=session)


def timeout_extension(seconds: float) -> dict[str, float]:
    """httpx's per-request timeout extension: connect (at most 10 s) and each read."""
    connect = min(seconds, 10.0)
    return {"connect": connect, "read": seconds, "write": seconds, "pool": connect}
