"""The one place that turns transport failures into the proxy's upstream errors.

httpx-aiohttp maps aiohttp's exceptions onto httpx's loosely (a dropped connection
surfaces as ``ConnectTimeout``), so the original aiohttp exception, kept as the cause,
decides when present. The lean transport (lean.py) raises httpx's exception for what
happened, with the socket's own error as the cause (``_socket_cause``): for TLS the same
``ssl`` errors aiohttp wraps (a certificate not verified, any other failed handshake). Each failure
gets a *cause* that says what broke (DNS, a refused port, the certificate, the TLS
handshake, the egress proxy, a timeout connecting or reading, a reset): the failure
reason of metrics and logs, and words in the client's message, which never names an
address or a credential.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import sys
from types import ModuleType

import httpx

from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable

__all__ = ["CAUSES", "map_transport_error"]

# cause -> what the client reads after "Could not reach the upstream deployment 'x': "
CAUSES = {
    "dns": "its host name could not be resolved",
    "refused": "the connection was refused",
    "tls_certificate": "its TLS certificate could not be verified",
    "tls_handshake": "the TLS handshake failed",
    "proxy": "the egress proxy could not be used",
    "connect_timeout": "connecting timed out",
    "reset": "the connection was reset",
    "connection": "the connection failed",
}


def map_transport_error(exc: BaseException, deployment: str) -> tuple[UpstreamError, str]:
    """The client-facing error and the failure's cause (the metric's reason label)."""
    cause = exc.__cause__ or exc
    plain = _socket_cause(exc)
    if plain is not None:
        kind = UpstreamTimeout if plain == "connect_timeout" else UpstreamUnavailable
        return _unreachable(deployment, plain, kind)
    aiohttp = _aiohttp()
    if aiohttp is not None and isinstance(cause, aiohttp.ConnectionTimeoutError):
        return _unreachable(deployment, "connect_timeout", UpstreamTimeout)
    if (
        isinstance(cause, asyncio.TimeoutError | TimeoutError)
        or (aiohttp is not None and isinstance(cause, aiohttp.ServerTimeoutError))
        or (cause is exc and isinstance(exc, httpx.TimeoutException))
    ):
        return (
            UpstreamTimeout(f"The upstream deployment '{deployment}' timed out."),
            "timeout",
        )
    connect = _connect_cause(cause)
    if connect is not None:
        return _unreachable(deployment, connect, UpstreamUnavailable)
    if cause is exc and isinstance(exc, httpx.ConnectError):
        return _unreachable(deployment, "connection", UpstreamUnavailable)
    if (
        aiohttp is not None
        and isinstance(cause, aiohttp.ClientOSError)
        and cause.errno == errno.ECONNRESET
    ):
        return _unreachable(deployment, "reset", UpstreamUnavailable)
    return (
        UpstreamUnavailable(
            f"The upstream deployment '{deployment}' closed the connection or sent an"
            " invalid response.",
            code="upstream_invalid_response",
        ),
        "protocol",
    )


def _aiohttp() -> ModuleType | None:
    """aiohttp, if loaded (client.py loads it for the first request that needs it): when
    it is not, none of its exceptions can be a cause."""
    return sys.modules.get("aiohttp")


def _socket_cause(exc: BaseException) -> str | None:
    """The lean transport's failures to connect, and resets before an answer (None: a
    timeout reading or a broken answer, which the general rules read alike)."""
    cause = exc.__cause__
    aiohttp = _aiohttp()
    if cause is None or (aiohttp is not None and isinstance(cause, aiohttp.ClientError)):
        return None
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.ConnectError):
        if isinstance(cause, ssl.CertificateError):  # as aiohttp's cert_errors
            return "tls_certificate"
        if isinstance(cause, ssl.SSLError):  # as aiohttp's ssl_errors
            return "tls_handshake"
        if isinstance(cause, socket.gaierror):
            return "dns"
        if isinstance(cause, ConnectionRefusedError):
            return "refused"
        return "connection"
    if isinstance(cause, ConnectionResetError):
        return "reset"
    return None


def _connect_cause(cause: BaseException) -> str | None:
    """What kept the connection from being made (None: it was made)."""
    aiohttp = _aiohttp()
    if aiohttp is None:
        return "tls_handshake" if isinstance(cause, ssl.SSLError) else None
    if isinstance(cause, aiohttp.ClientConnectorCertificateError):
        return "tls_certificate"
    if isinstance(cause, aiohttp.ClientConnectorSSLError | ssl.SSLError):
        return "tls_handshake"
    if isinstance(cause, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return "proxy"
    if isinstance(cause, aiohttp.ClientConnectorDNSError):
        return "dns"
    if isinstance(cause, aiohttp.ClientConnectorError):
        if isinstance(cause.os_error, ConnectionRefusedError):
            return "refused"
        return "connection"
    return None


def _unreachable(
    deployment: str, cause: str, kind: type[UpstreamError]
) -> tuple[UpstreamError, str]:
    message = f"Could not reach the upstream deployment '{deployment}': {CAUSES[cause]}."
    code = "upstream_timeout" if kind is UpstreamTimeout else "upstream_connection_error"
    return kind(message, code=code), cause
