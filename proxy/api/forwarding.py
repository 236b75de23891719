"""The forwarding endpoints as plain ASGI: raw bytes in, raw bytes out.

The hot path skips Starlette's request and response objects (and, through
``HotPathRouter``, the middleware stack): it reads the body from ``receive`` under the
size limit, hands it to the pipeline, and writes the reply with ``send``. A streamed
reply races the client's ``http.disconnect``, so a client that goes away closes the
upstream request at once, not at the next chunk. Under the CLI the proxy's own HTTP
protocol (``direct.py``) runs the same endpoint without ASGI messages
(``ForwardingEndpoint.serve`` with its own writer); under any other ASGI server, the
endpoint is this plain ASGI app.

An HTTP/1.0 client cannot read a chunked body, and uvicorn's stock protocol chunks every
body sent without a length: under a server whose scope does not say it sends such a
body unframed, ended by closing the connection (``CLOSE_DELIMITED``: the proxy's own
protocol, ``protocol.CloseDelimited``), a stream to an HTTP/1.0 client is collected and
sent whole, with its length (``Whole``), at most ``server.max_upstream_body_size``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.api import CLOSE_DELIMITED
from proxy.api.responses import error_response
from proxy.errors import (
    BodyTooLarge,
    HeadersTooLarge,
    InvalidRequest,
    ModelNotFound,
    ProxyError,
    RequestTimeout,
    UnsupportedMediaType,
    UpstreamUnavailable,
)
from proxy.pipeline.pipeline import Pipeline
from proxy.request.call import ClientGone, Reply, StreamSource, WatchDeparture
from proxy.request.request_ids import HEADER, new_request_id
from proxy.shapes import match
from proxy.shapes.base import AT_PATH, ClientCredential, RequestTarget, Shape

__all__ = ["ForwardingEndpoint", "HotPathRouter", "Whole", "whole_for"]


class ForwardingEndpoint:
    """One path of an API shape that the proxy forwards (an ASGI app)."""

    def __init__(self, shape: Shape, pipeline: Callable[[], Pipeline]) -> None:
        self.shape = shape
        self._pipeline = pipeline
        # Its credential's headers, never forwarded (those of the common schemes the
        # upstream headers' rules drop already): None, none to take out.
        own = frozenset(shape.credential.headers) - {"authorization", "x-api-key"}
        self._private = own or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app: the portable path, under any ASGI server."""
        whole = whole_for(scope, self.shape, self._pipeline)
        write = partial(send_reply, receive=receive, send=send, whole=whole)
        await self.serve(scope["headers"], receive, write, target=target_of(scope))

    async def serve(
        self,
        raw_headers: list[tuple[bytes, bytes]],
        receive: Receive,
        write: Callable[[Reply], Awaitable[None]],
        *,
        body: bytes | None = None,
        watch_departure: WatchDeparture | None = None,
        target: RequestTarget = AT_PATH,
    ) -> None:
        """Answer one request whose body ``receive`` gives; ``write`` sends the reply (the
        ASGI messages, or ``direct.write_reply`` under the proxy's own protocol, which
        also hands over the ``body`` when all of it has arrived already, and hears the
        client's departure without a task: ``watch_departure``). ``target``: what its
        URL says (a path template's values, its query)."""
        # The pipeline in force when the request arrived serves it to the end, even if a
        # reload replaces it meanwhile (it is retired once its requests are done).
        pipeline = self._pipeline()
        pipeline.enter()
        try:
            reply = await self._answer(
                pipeline, raw_headers, receive, body, watch_departure, target
            )
            if reply is not None:
                await write(reply)
        finally:
            pipeline.leave()

    async def _answer(
        self,
        pipeline: Pipeline,
        raw_headers: list[tuple[bytes, bytes]],
        receive: Receive,
        body: bytes | None,
        watch_departure: WatchDeparture | None,
        target: RequestTarget,
    ) -> Reply | None:
        """None: the client left before its body arrived (nobody to answer). The key is
        checked from the headers (or the query) first: a stranger's body is never read
        (401 at once)."""
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
        lookup = dict(headers)
        server = pipeline.settings.server
        credential = self.shape.credential
        try:
            header, presented = _presented(credential, raw_headers, lookup, target)
            key = pipeline.keys.authenticate(presented, credential, header)
            _check_content_type(lookup.get("content-type"))
            limit = server.max_body_size
            if body is not None:  # here whole: nothing to wait for, no timer
                if len(body) > limit:
                    raise _too_large(limit)
                raw = body
            else:
                async with asyncio.timeout(server.body_timeout):
                    raw = await _read_body(receive, lookup.get("content-length"), limit)
        except ClientGone:
            return None
        except TimeoutError:
            timeout = RequestTimeout(
                f"The request body did not arrive within {server.body_timeout:g} seconds."
            )
            return pipeline.reject(self.shape, timeout, close=True)
        except ProxyError as error:
            return pipeline.reject(self.shape, error)
        return await pipeline.handle(
            self.shape,
            raw,
            headers if self._private is None else _without(headers, self._private),
            key,
            client_left=partial(_disconnected, receive),
            watch_departure=watch_departure,
            target=target,
        )


def _presented(
    credential: ClientCredential,
    raw_headers: list[tuple[bytes, bytes]],
    lookup: dict[str, str],
    target: RequestTarget,
) -> tuple[str, str | None]:
    """Where the request's key came (a header's name, else a query parameter's) and its
    value: its headers first, then its URL's query (``ClientCredential.query``)."""
    header, presented = presented_key(credential.headers, raw_headers, lookup)
    if presented is None and credential.query:
        return _in_query(credential.query, target)
    return header, presented


def _without(headers: list[tuple[str, str]], names: frozenset[str]) -> list[tuple[str, str]]:
    """``headers`` but those named ``names`` (a shape's own credential headers)."""
    return [(k, v) for k, v in headers if k.lower() not in names]


def _in_query(names: tuple[str, ...], target: RequestTarget) -> tuple[str, str | None]:
    """The first of the credential's query parameters ``names`` the URL carries, and its
    value (the last name and None: none)."""
    for name in names:
        found = target.arg(name)
        if found is not None:
            return name, found
    return (names[-1] if names else ""), None


def target_of(scope: Scope) -> RequestTarget:
    """What a forwarded request's URL says: its path template's values, its query."""
    query = scope.get("query_string", b"").decode("latin-1")
    found = match(scope["path"], query)
    return AT_PATH if found is None else found[1]


def presented_key(
    names: tuple[str, ...],
    raw_headers: list[tuple[bytes, bytes]],
    lookup: dict[str, str] | None = None,
) -> tuple[str, str | None]:
    """The first of the credential's headers ``names`` the request carries, and its value
    (the last name and None: none); each of them sent twice is refused (``_single``).
    ``lookup``: the headers as a dict, when the caller has it (fewer scans)."""
    twice = lookup is None or len(lookup) < len(raw_headers)  # one of these twice?
    for name in names:
        value = _single(raw_headers, name) if twice or lookup is None else lookup.get(name)
        if value is not None:
            return name, value
    return (names[-1] if names else ""), None


def _single(raw_headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The one header ``name`` (a credential's); two are refused (which one counts is
    ambiguous between the proxy and whatever stands before it)."""
    wanted = name.encode("latin-1")
    found = [v for k, v in raw_headers if k.lower() == wanted]  # any ASGI server
    if len(found) > 1:
        shown = "Authorization" if name == "authorization" else name
        raise InvalidRequest(
            f"Send one {shown} header, not several.", code=f"duplicate_{name.replace('-', '_')}"
        )
    return found[0].decode("latin-1") if found else None


class HotPathRouter:
    """Sends POSTs to the forwarding endpoints straight to them; all else to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        endpoints: dict[str, ForwardingEndpoint],
        patterned: dict[str, ForwardingEndpoint] | None = None,
    ) -> None:
        """``endpoints`` by exact path; ``patterned``: by the name of a shape served at
        path templates (``shapes.match`` finds which)."""
        self.app = app
        self.endpoints = endpoints
        self.patterned = patterned or {}
        self._by_target = {path.encode("ascii"): endpoint for path, endpoint in endpoints.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        scope = _canonical(scope)
        endpoint = self._forwarding(scope)
        if endpoint is not None and not _oversized(scope["headers"]):
            await endpoint(scope, receive, send)  # the pipeline names its request
            return
        send = _with_request_id(send)
        try:
            if _oversized(scope["headers"]):
                raise HeadersTooLarge(
                    f"Request headers may be at most {MAX_HEADER} bytes each and"
                    f" {MAX_HEADERS} bytes in all."
                )  # never forwarded
            if _encoded_slash(scope):
                raise ModelNotFound(f"Unknown path {scope['path'][:200]}.", code="unknown_url")
            _single(scope["headers"], "authorization")  # one, on every route
        except ProxyError as error:
            await error_response(error, scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def forwarding(self, scope: Scope) -> ForwardingEndpoint | None:
        """The forwarding endpoint that would serve ``scope`` (None: the app would, or it
        is refused first): what the proxy's own protocol serves without ASGI messages."""
        if _oversized(scope["headers"]):
            return None
        return self._forwarding(_canonical(scope))

    def direct(
        self, target: bytes, headers: list[tuple[bytes, bytes]]
    ) -> ForwardingEndpoint | None:
        """The forwarding endpoint whose path a POST's request ``target`` is exactly (no
        query, no trailing slash, nothing percent-encoded), unless its ``headers`` are over
        the bounds: what the proxy's own protocol serves with no ASGI scope made."""
        endpoint = self._by_target.get(target)
        return None if endpoint is None or _oversized(headers) else endpoint

    def _forwarding(self, scope: Scope) -> ForwardingEndpoint | None:
        if scope["type"] == "http" and scope["method"] == "POST" and not _encoded_slash(scope):
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is None and self.patterned:
                found = match(scope["path"])
                endpoint = None if found is None else self.patterned.get(found[0].name)
            return endpoint
        return None

    @property
    def state(self) -> object:
        """The wrapped app's state (``pipeline``, ``metrics``...), for tests and probes."""
        return getattr(self.app, "state")  # noqa: B009


def _canonical(scope: Scope) -> Scope:
    """A path with a trailing slash is served as its canonical path: a redirect would lose
    a POST's body."""
    path = scope.get("path", "")
    if path.endswith("/") and len(path) > 1:
        return {**scope, "path": path.rstrip("/") or "/"}
    return scope


def _encoded_slash(scope: Scope) -> bool:
    """A ``%2f`` in the raw path: decoded, it would route as a path it is not (only a
    model's name, in ``/v1/models/{model}``, may hold one)."""
    raw: bytes = scope.get("raw_path") or b""
    return b"%" in raw and b"%2f" in raw.lower() and not raw.startswith(b"/v1/models/")


_REQUEST_ID = HEADER.encode()


def _with_request_id(send: Send) -> Send:
    """``send`` that gives the answer an ``x-request-id`` (routes other than forwarding:
    models, health, metrics, admin, 404s and 405s)."""
    request_id = new_request_id().encode()

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(name.lower() == _REQUEST_ID for name, _ in headers):
                headers.append((_REQUEST_ID, request_id))
            message = {**message, "headers": headers}
        await send(message)

    return send_with_id


MAX_HEADER = 8 * 1024  # bytes in one header (name and value), as the contract says
MAX_HEADERS = 32 * 1024  # in all


def _oversized(headers: list[tuple[bytes, bytes]]) -> bool:
    total = 0
    for name, value in headers:
        size = len(name) + len(value)
        if size > MAX_HEADER:
            return True
        total += size
    return total > MAX_HEADERS


def _check_content_type(content_type: str | None) -> None:
    if content_type is None:
        return  # lenient: a JSON body without a declared type is still parsed
    media = content_type.split(";", 1)[0].strip().lower()
    if not (media == "application/json" or media.endswith("+json")):
        raise UnsupportedMediaType(f"Content-Type must be application/json, not '{media[:100]}'.")


async def _read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")


async def _disconnected(receive: Receive) -> None:
    """Return once the client has closed its connection (its body was read already)."""
    message: Message = {"type": ""}
    while message["type"] != "http.disconnect":
        message = await receive()


def _raw_headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]


@dataclass(frozen=True, slots=True)
class Whole:
    """A stream to send whole, with its length (an HTTP/1.0 client's under a server that
    would chunk it): at most ``limit`` bytes, else a 502 in ``shape``'s error shape."""

    limit: int
    shape: Shape


def whole_for(scope: Scope, shape: Shape, pipeline: Callable[[], Pipeline]) -> Whole | None:
    """How a stream is sent to the request of ``scope``: whole (``Whole``) to an HTTP/1.0
    client unless the server sends it unframed (``CLOSE_DELIMITED``); None: as it comes."""
    if scope.get("http_version") != "1.0" or CLOSE_DELIMITED in scope.get("extensions", {}):
        return None
    return Whole(pipeline().settings.server.max_upstream_body_size, shape)


async def send_reply(
    reply: Reply, receive: Receive, send: Send, whole: Whole | None = None
) -> None:
    """``reply`` as ASGI messages; a stream as it comes, or collected first (``whole``)."""
    if reply.stream is None:
        await _send_buffered(reply, send)
        return
    if whole is None:
        pump = _pump(reply, reply.stream, send)
    else:
        pump = _pump_whole(reply, reply.stream, send, whole)
    await _send_stream(pump, reply.stream, receive)


async def _send_buffered(reply: Reply, send: Send) -> None:
    headers = _raw_headers(reply)
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


async def _pump(reply: Reply, body: StreamSource, send: Send) -> None:
    await send(
        {"type": "http.response.start", "status": reply.status, "headers": _raw_headers(reply)}
    )
    async for chunk in body:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _pump_whole(reply: Reply, body: StreamSource, send: Send, whole: Whole) -> None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > whole.limit:
            error = UpstreamUnavailable(
                f"The streamed answer exceeds {whole.limit} bytes"
                " (server.max_upstream_body_size), the most an HTTP/1.0 client is sent"
                " whole; ask over HTTP/1.1 to have it passed through as it comes.",
                code="upstream_error",
            )
            headers = {"content-type": "application/json", HEADER: reply.headers.get(HEADER, "")}
            reply = Reply(error.status, headers, whole.shape.error_body(error))
            break
        chunks.append(chunk)
    else:
        reply = Reply(reply.status, reply.headers, b"".join(chunks))
    await _send_buffered(reply, send)


async def _send_stream(pump: Awaitable[None], body: StreamSource, receive: Receive) -> None:
    """Run ``pump`` (the stream's chunks on their way) until the upstream ends or the
    client leaves, whichever first; either way the upstream response is closed and the
    budgets settled."""
    streaming = asyncio.ensure_future(pump)
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (streaming, watching):
            task.cancel()
        for task in (streaming, watching):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        await body.aclose()
