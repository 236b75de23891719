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
from collections.abc import Callable
from types import ModuleType
from typing import Any

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
    reason = _socket_cause(exc) or _reason(exc)
    if reason == "timeout":
        return UpstreamTimeout(f"The upstream deployment '{deployment}' timed out."), reason
    if reason == "protocol":
        return (
            UpstreamUnavailable(
                f"The upstream deployment '{deployment}' closed the connection or sent an"
                " invalid response.",
                code="upstream_invalid_response",
            ),
            reason,
        )
    kind = UpstreamTimeout if reason == "connect_timeout" else UpstreamUnavailable
    return _unreachable(deployment, reason, kind)


# A row of a table of causes: the exceptions it is for, and what broke (a cause of
# CAUSES, "timeout" or "protocol"), or how to tell from the exception.
_Row = tuple[type[BaseException] | tuple[type[BaseException], ...], str | Callable[[Any], str]]

# httpx's own exceptions, when nothing more precise was kept as their cause.
_HTTPX_ROWS: tuple[_Row, ...] = (
    (httpx.TimeoutException, "timeout"),
    (httpx.ConnectError, "connection"),
)


def _reason(exc: BaseException) -> str:
    """What broke, as httpx's ``map_exceptions`` maps: the first row that the cause kept
    (else the exception itself) is an instance of; "protocol" (a broken answer) if none."""
    cause = exc.__cause__ or exc
    rows = _cause_rows(_aiohttp())
    for types, reason in (*rows, *_HTTPX_ROWS) if cause is exc else rows:
        if isinstance(cause, types):
            return reason if isinstance(reason, str) else reason(cause)
    return "protocol"


def _cause_rows(aiohttp: ModuleType | None) -> tuple[_Row, ...]:
    """What each cause httpx-aiohttp keeps means (a timeout's and TLS's own exceptions
    too), the most specific first; aiohttp's only when it is loaded."""
    if aiohttp is None:
        return (((asyncio.TimeoutError, TimeoutError), "timeout"), (ssl.SSLError, "tls_handshake"))
    return (
        (aiohttp.ConnectionTimeoutError, "connect_timeout"),
        ((asyncio.TimeoutError, TimeoutError, aiohttp.ServerTimeoutError), "timeout"),
        (aiohttp.ClientConnectorCertificateError, "tls_certificate"),
        ((aiohttp.ClientConnectorSSLError, ssl.SSLError), "tls_handshake"),
        ((aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError), "proxy"),
        (aiohttp.ClientConnectorDNSError, "dns"),
        (aiohttp.ClientConnectorError, _refused_or_failed),
        (aiohttp.ClientOSError, _reset_or_broken),
    )


def _refused_or_failed(cause: Any) -> str:
    """aiohttp's failure to connect: refused, or failed otherwise (its ``os_error``)."""
    return "refused" if isinstance(cause.os_error, ConnectionRefusedError) else "connection"


def _reset_or_broken(cause: Any) -> str:
    """aiohttp's socket error once connected: a reset, else a broken answer."""
    return "reset" if cause.errno == errno.ECONNRESET else "protocol"


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


def _unreachable(
    deployment: str, cause: str, kind: type[UpstreamError]
) -> tuple[UpstreamError, str]:
    message = f"Could not reach the upstream deployment '{deployment}': {CAUSES[cause]}."
    code = "upstream_timeout" if kind is UpstreamTimeout else "upstream_connection_error"
    return kind(message, code=code), cause
