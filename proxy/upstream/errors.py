"""The one place that turns transport failures into the proxy's upstream errors.

httpx-aiohttp maps aiohttp's exceptions onto httpx's loosely (a dropped connection
surfaces as ``ConnectTimeout``), so the original aiohttp exception, kept as the cause,
decides when present.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable

__all__ = ["map_transport_error"]


def map_transport_error(exc: BaseException, deployment: str) -> tuple[UpstreamError, str]:
    """The client-facing error and a failure reason (metric label) for a transport error.

    Messages name the deployment id (from config), never its URL or key.
    """
    cause = exc.__cause__ or exc
    if isinstance(cause, aiohttp.ServerTimeoutError | asyncio.TimeoutError | TimeoutError) or (
        cause is exc and isinstance(exc, httpx.TimeoutException)
    ):
        return (
            UpstreamTimeout(f"The upstream deployment '{deployment}' timed out."),
            "timeout",
        )
    if isinstance(cause, aiohttp.ClientConnectorError) or (
        cause is exc and isinstance(exc, httpx.ConnectError)
    ):
        return (
            UpstreamUnavailable(
                f"Could not connect to the upstream deployment '{deployment}'.",
                code="upstream_connection_error",
            ),
            "connection",
        )
    return (
        UpstreamUnavailable(
            f"The upstream deployment '{deployment}' closed the connection or sent an"
            " invalid response.",
            code="upstream_invalid_response",
        ),
        "protocol",
    )
