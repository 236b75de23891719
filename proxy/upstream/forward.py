"""Building the upstream request and sending it (one place for transport errors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from proxy.catalog.catalog import EGRESS, DeploymentRoute, Egress
from proxy.errors import InvalidRequest, UpstreamError, UpstreamUnavailable
from proxy.providers.base import HeadersInBody
from proxy.request.json_splice import set_fields
from proxy.shapes.base import Shape
from proxy.upstream.encoding import Undecodable, decoder_for
from proxy.upstream.errors import map_transport_error
from proxy.upstream.headers import request_headers
from proxy.upstream.interface import (
    HEADER_MAP,
    AnswerTooLarge,
    UpstreamRequest,
    UpstreamStream,
)

__all__ = [
    "TransportFailure",
    "UnusableAnswer",
    "build_request",
    "discard",
    "read_body",
    "send",
    "undecodable",
]

# The most of an unneeded body (a failure's) read to keep its connection; past it the
# connection is closed instead.
DISCARD_LIMIT = 64 * 1024


class TransportFailure(Exception):
    """No (complete) HTTP answer: ``error`` for the client, ``reason`` for metrics."""

    def __init__(self, error: UpstreamError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class UnusableAnswer(Exception):
    """A complete HTTP answer the proxy will not pass on: a body over the bound, or one
    it cannot decode. ``error`` for the client, ``reason`` for metrics. Not the
    deployment's ill health: another deployment would send the same."""

    def __init__(self, error: UpstreamError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


def build_request(
    shape: Shape,
    body: dict[str, Any],
    raw: bytes | None,
    client_headers: list[tuple[str, str]],
    deployment: DeploymentRoute,
    stream: bool,
    method: str = "POST",
    path: str = "",
    asked: str | None = None,
) -> tuple[UpstreamRequest, bool]:
    """The upstream request, and whether the proxy added the usage event to a stream.

    The client's bytes go as they are unless ``model`` must change or the shape needs
    more of the upstream (a stream's usage, to settle the token budgets) than the client
    asked for (``Shape.prepare``); ``raw`` None: ``body`` is not the client's (a
    translation: proxy/translate) and is always serialized. ``method`` and ``path``
    (below the shape's URL): a stored object's routes (``GET /v1/responses/{id}``...),
    whose body is empty. ``asked``: the model as the client named it, which a
    deployment's wire puts in the URL when the deployment names none (a shape with its
    model in the URL has none in its body).
    """
    prepared = shape.prepare(body, stream)
    model = deployment.model_for(shape.name)  # None: the client's, as it asked
    if raw is None:
        payload = _translated(body, model, prepared.changed)
    elif (model is not None and model != body.get("model") and "model" in body) or prepared.changed:
        changed: dict[str, Any] = {} if model is None else {"model": model}
        changed.update(prepared.changed)
        try:
            payload = orjson.dumps({**body, **changed})
        except orjson.JSONEncodeError:  # nested deeper than orjson dumps: splice instead
            payload = _spliced(raw, changed)
    else:
        payload = raw
    egress = deployment.extensions[EGRESS]
    assert isinstance(egress, Egress)
    headers = request_headers(client_headers, egress.credential, egress.headers, egress.defaults)
    url, target = deployment.target(shape.name)
    if deployment.wire is not None:  # the model or the stream in its URL, its own fields
        named = asked if model is None else model
        target, payload = deployment.wire.outgoing(shape.name, named, stream, payload)
        if isinstance(deployment.wire, HeadersInBody):  # Bedrock's anthropic_beta
            payload = deployment.wire.carried(shape.name, client_headers, payload)
        url = httpx.URL(target)
    headers["content-length"] = str(len(payload))
    if path:  # a stored object's route below the shape's URL (a response's id...)
        target = _below(target, path)
        url = httpx.URL(target)
    request = UpstreamRequest(url, target, headers, payload, deployment.extensions, method)
    return request, prepared.strip_usage


def _below(target: str, path: str) -> str:
    """``path`` (``/{id}/cancel?query``) appended to the path of URL ``target``."""
    base, _, query = target.partition("?")
    tail, _, tail_query = path.partition("?")
    joined = "&".join(q for q in (tail_query, query) if q)
    return base + tail + ("?" + joined if joined else "")


async def send(
    transport: httpx.AsyncBaseTransport, request: httpx.Request, deployment: str
) -> httpx.Response:
    """Send ``request``; the response's body is still to be read (or streamed)."""
    try:
        return await transport.handle_async_request(request)
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        raise TransportFailure(*map_transport_error(exc, deployment)) from None


async def read_body(response: httpx.Response, deployment: str, limit: int | None = None) -> bytes:
    """The whole body of a buffered answer, decoded (encoding.py), at most ``limit``
    bytes before and after decoding (None: no bound); the response is closed either
    way."""
    headers = response.extensions.get(HEADER_MAP) or response.headers
    try:
        decoder = decoder_for(headers.get("content-encoding"))
        body = await _read(response, _declared(headers.get("content-length"), limit))
        return body if decoder is None else decoder.whole(body, limit)
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        raise TransportFailure(*map_transport_error(exc, deployment)) from None
    except AnswerTooLarge as exc:
        message = (
            f"The upstream deployment '{deployment}' answered with a body over {exc.limit}"
            " bytes (server.max_upstream_body_size)."
        )
        raise UnusableAnswer(
            UpstreamUnavailable(message, code="upstream_error"), "too_large"
        ) from None
    except Undecodable as exc:
        raise undecodable(deployment, exc) from None
    finally:
        await response.aclose()


def undecodable(deployment: str, exc: Undecodable) -> UnusableAnswer:
    """A body, buffered or streamed, whose content-encoding cannot be undone."""
    message = f"The upstream deployment '{deployment}' answered with {exc}."
    return UnusableAnswer(UpstreamUnavailable(message, code="upstream_error"), "encoding")


async def discard(response: httpx.Response) -> bytes:
    """Read and close an answer whose body is not passed on (the connection is reused if
    it was short); what was read, as it came (empty past ``DISCARD_LIMIT`` or on an
    error): a failure's body may still say something (Google's ``RetryInfo``)."""
    try:
        return await _read(response, DISCARD_LIMIT)
    except (TimeoutError, httpx.HTTPError, OSError, AnswerTooLarge):
        return b""
    finally:
        await response.aclose()


async def _read(response: httpx.Response, limit: int | None) -> bytes:
    stream = response.stream
    if isinstance(stream, UpstreamStream):
        return await stream.read(limit)  # one read, not httpx's chunk by chunk iteration
    body = await response.aread()
    if limit is not None and len(body) > limit:
        raise AnswerTooLarge(limit)
    return body


def _declared(length: str | None, limit: int | None) -> int | None:
    """``limit``, checked first against the body's announced length: a body announced
    over it is refused before a byte of it is read."""
    if limit is None or length is None:
        return limit
    length = length.strip()
    # Strictly digits (no "²", no "-1"); more than 18 of them is over any bound.
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > limit):
        raise AnswerTooLarge(limit)
    return limit


def _translated(body: dict[str, Any], model: str | None, changed: Mapping[str, Any]) -> bytes:
    """A translated body's bytes, its ``model`` the deployment's (None: as it is)."""
    try:
        return orjson.dumps({**body, **({} if model is None else {"model": model}), **changed})
    except orjson.JSONEncodeError:  # nested deeper than orjson dumps (the client's was too)
        raise InvalidRequest(
            "The request is nested too deeply to be translated.", code="invalid_type"
        ) from None


def _spliced(raw: bytes, changed: dict[str, Any]) -> bytes:
    try:
        return set_fields(raw, changed)
    except orjson.JSONEncodeError:  # what changes is itself too deep (stream_options)
        param = next((name for name in changed if name != "model"), "model")
        raise InvalidRequest(
            f"'{param}' is nested too deeply.", code="invalid_type", param=param
        ) from None
