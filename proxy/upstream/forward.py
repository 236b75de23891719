"""Building the upstream request and sending it (one place for transport errors)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from proxy.catalog import EGRESS, DeploymentRoute, Egress
from proxy.errors import InvalidRequest, UpstreamError
from proxy.json_splice import set_fields
from proxy.upstream.errors import map_transport_error
from proxy.upstream.headers import request_headers
from proxy.upstream.interface import UpstreamRequest, UpstreamStream

__all__ = ["TransportFailure", "build_request", "discard", "read_body", "send"]


class TransportFailure(Exception):
    """No (complete) HTTP answer: ``error`` for the client, ``reason`` for metrics."""

    def __init__(self, error: UpstreamError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


def build_request(
    endpoint: str,
    body: dict[str, Any],
    raw: bytes,
    client_headers: list[tuple[str, str]],
    deployment: DeploymentRoute,
    stream: bool,
) -> tuple[UpstreamRequest, bool]:
    """The upstream request, and whether the proxy added the usage chunk to a stream.

    The client's bytes go as they are unless ``model`` must change or the proxy needs the
    stream's usage (to settle the token budget), which the client did not ask for.
    """
    add_usage = stream and not _asks_usage(body)
    payload = raw
    if deployment.upstream_model != body.get("model") or add_usage:
        changed: dict[str, Any] = {"model": deployment.upstream_model}
        if add_usage:
            options = body.get("stream_options") or {}
            changed["stream_options"] = {**options, "include_usage": True}
        try:
            payload = orjson.dumps({**body, **changed})
        except orjson.JSONEncodeError:  # nested deeper than orjson dumps: splice instead
            payload = _spliced(raw, changed)
    egress = deployment.extensions[EGRESS]
    assert isinstance(egress, Egress)
    headers = request_headers(client_headers, egress.credential, egress.headers)
    headers["content-length"] = str(len(payload))
    url, target = deployment.target(endpoint)
    request = UpstreamRequest(url, target, headers, payload, deployment.extensions)
    return request, add_usage


async def send(
    transport: httpx.AsyncBaseTransport, request: httpx.Request, deployment: str
) -> httpx.Response:
    """Send ``request``; the response's body is still to be read (or streamed)."""
    try:
        return await transport.handle_async_request(request)
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        raise TransportFailure(*map_transport_error(exc, deployment)) from None


async def read_body(response: httpx.Response, deployment: str) -> bytes:
    """The whole body of a buffered answer; the response is closed either way."""
    try:
        return await _read(response)
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        raise TransportFailure(*map_transport_error(exc, deployment)) from None
    finally:
        await response.aclose()


async def discard(response: httpx.Response) -> None:
    """Read and close an answer whose body nobody needs (the connection is reused)."""
    try:
        await _read(response)
    except (TimeoutError, httpx.HTTPError, OSError):
        pass
    finally:
        await response.aclose()


async def _read(response: httpx.Response) -> bytes:
    stream = response.stream
    if isinstance(stream, UpstreamStream):
        return await stream.read()  # one read, not httpx's chunk by chunk iteration
    return await response.aread()


def _spliced(raw: bytes, changed: dict[str, Any]) -> bytes:
    try:
        return set_fields(raw, changed)
    except orjson.JSONEncodeError:  # what changes is itself too deep: stream_options
        raise InvalidRequest(
            "'stream_options' is nested too deeply.", code="invalid_type", param="stream_options"
        ) from None


def _asks_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
