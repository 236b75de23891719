"""The one pooled HTTP client per process.

httpx's API over aiohttp's connection pool: measured on a 2-core machine, a minimal
proxy served ~500 req/s with httpx's default transport and ~1,860 with this one.
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

__all__ = ["create_http_client"]


def create_http_client(max_connections: int = 1000, keepalive: float = 30.0) -> httpx.AsyncClient:
    """A client for all upstream calls; create it inside the running event loop."""
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
    )
    transport = AiohttpTransport(client=session)
    # Each request overrides the timeout with its deployment's own.
    return httpx.AsyncClient(transport=transport, timeout=60.0, follow_redirects=False)
