"""The one pooled upstream transport per process.

httpx's transport API (``httpx.Request`` in, ``httpx.Response`` out) over aiohttp's
connection pool. Measured on a 2-core machine, a minimal proxy served ~500 req/s with
httpx's default transport and ~1,860 with httpx-aiohttp's ``AiohttpTransport``; this one
is that transport cut to what a proxy needs (targets are parsed once per URL, with the
egress proxy the environment gives them; a deployment's own TLS context, proxy and
headers come ready-made with the request, ``catalog.Egress``), and its stream hands a
buffered answer over
in one read (``UpstreamStream.read``) instead of httpx's chunk iteration. aiohttp's
exceptions are mapped onto httpx's exactly as httpx-aiohttp maps them, the original kept
as the cause (upstream/errors.py reads it).

The proxy calls the transport directly rather than through ``httpx.AsyncClient``: it
needs no cookies, redirects, auth flows or URL merging, and skipping them was a quarter
of the forwarding cost.

Upstreams reached without an egress proxy (``http://`` and ``https://``, the latter with
the deployment's TLS context) go to the lean transport (``lean.py``: asyncio's protocol
API and httptools, about a third of this one's cost); egress proxies and ``HEAD`` stay
here. The choice is made per URL once, and per request by the deployment's ``Egress``
(its own ``proxy_url``). aiohttp is imported, and its session made, at start-up when a
deployment will need them (``prepare``), else when a request first does (a ``HEAD``, a
deployment a reload added): a worker whose upstreams are all reached directly never
loads it (about an eighth of a worker's start).
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import httpx
from yarl import URL

from proxy.catalog.catalog import EGRESS, Egress
from proxy.upstream.interface import (
    HEADER_MAP,
    AnswerTooLarge,
    UpstreamRequest,
    UpstreamStream,
)
from proxy.upstream.lean import MAX_TARGETS, LeanTransport

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "HEADER_MAP",
    "UpstreamStream",
    "UpstreamTransport",
    "create_transport",
]

_HTTP11 = {"http_version": b"HTTP/1.1"}


class _AiohttpStream(UpstreamStream):
    """An aiohttp answer's body: streamed chunk by chunk as it arrives, or read whole."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except Exception as exc:
            _raise_mapped(exc)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body in one go (a buffered answer), at most ``limit`` bytes."""
        response = self._response
        try:
            length = response.content_length
            if limit is None or (length is not None and length <= limit):
                return await response.read()  # its length is known, and within the bound
            content = response.content
            parts: list[bytes] = []
            size = 0
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:
                    raise AnswerTooLarge(limit)
                parts.append(chunk)
            return b"".join(parts)
        except AnswerTooLarge:
            raise
        except Exception as exc:
            _raise_mapped(exc)

    async def aclose(self) -> None:
        try:
            await self._response.__aexit__(None, None, None)
        except Exception as exc:
            _raise_mapped(exc)


class _Target:
    """A parsed upstream URL and the egress proxy the environment names for it."""

    __slots__ = ("env_proxy", "env_proxy_auth", "lean", "url")

    def __init__(self, url: str) -> None:
        self.url = URL(url)
        self.env_proxy, self.env_proxy_auth = _env_proxy(self.url)
        # Straight to the upstream, TLS or not: the lean transport can take it.
        self.lean = self.url.scheme in ("http", "https") and self.env_proxy is None


def _env_proxy(url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The egress proxy HTTPS_PROXY / HTTP_PROXY / NO_PROXY name for ``url``, as every
    HTTP tool reads them, with its netrc credentials (None: none). aiohttp's reading is
    asked only when the environment names a proxy for the URL's scheme: it finds one for
    no other (``proxies_from_env`` keeps ``getproxies``' schemes)."""
    if url.scheme not in urllib.request.getproxies():
        return None, None
    from aiohttp.helpers import get_env_proxy_for_url

    try:
        return get_env_proxy_for_url(url)
    except LookupError:  # NO_PROXY names the host
        return None, None


class UpstreamTransport(httpx.AsyncBaseTransport):
    """``lean``: the transport for upstreams without an egress proxy (None: this one takes
    every request)."""

    def __init__(
        self,
        new_session: Callable[[], aiohttp.ClientSession],
        lean: LeanTransport | None = None,
    ) -> None:
        self._new_session = new_session  # called on the first request that needs it
        self._session: aiohttp.ClientSession | None = None
        self._lean = lean
        self._targets: dict[str, _Target] = {}
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}

    def prepare(self, deployments: Iterable[tuple[str, bool]]) -> None:
        """At start-up, inside the event loop: load aiohttp and make its session now if a
        deployment will need them (``deployments``: each one's base URL, and whether it
        names its own egress proxy), so that its first request pays no import (a tenth
        of a second, the event loop held)."""
        if any(proxied or not _Target(url).lean for url, proxied in deployments):
            self._opened()

    def _opened(self) -> aiohttp.ClientSession:
        """The aiohttp session, made on the first call."""
        if self._session is None:
            self._session = self._new_session()
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.target if isinstance(request, UpstreamRequest) else str(request.url)
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= MAX_TARGETS:  # URLs with ids in them: kept bounded
                self._targets.clear()
            target = self._targets[url] = _Target(url)
        if target.lean and self._lean is not None and request.method != "HEAD":
            egress = request.extensions.get(EGRESS)
            if not isinstance(egress, Egress):
                return await self._lean.forward(request, url)
            if egress.proxy is None:
                return await self._lean.forward(request, url, egress.ssl)
        return await self._general(request, target)

    async def _general(self, request: httpx.Request, target: _Target) -> httpx.Response:
        try:
            content: bytes | httpx.AsyncByteStream | None = request.content or None
        except httpx.RequestNotRead:
            content = request.stream  # type: ignore[assignment]
        options: dict[str, Any] = {}
        egress = request.extensions.get(EGRESS)
        if isinstance(egress, Egress):
            if egress.ssl is not None:
                options["ssl"] = egress.ssl
            if egress.proxy is not None:
                options["proxy"] = egress.proxy  # the deployment's own wins
        if "proxy" not in options and target.env_proxy is not None:
            options["proxy"] = target.env_proxy
            options["proxy_auth"] = target.env_proxy_auth
        try:
            response = await self._opened().request(
                request.method,
                target.url,
                headers=[
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                ],
                data=content,
                allow_redirects=False,
                timeout=self._timeout(request.extensions.get("timeout")),
                **options,
            )
        except Exception as exc:
            _raise_mapped(exc)
        # The headers also as a plain dict: spares the caller httpx's lookups, each a scan.
        header_map = {k.lower(): v for k, v in response.headers.items()}
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_AiohttpStream(response),
            request=request,
            extensions={**_HTTP11, HEADER_MAP: header_map},
        )

    def _timeout(self, spec: Mapping[str, float | None] | None) -> aiohttp.ClientTimeout:
        spec = spec or {}
        key = (spec.get("connect"), spec.get("read"), spec.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            import aiohttp  # loaded with the session, before any timeout is asked for

            timeout = self._timeouts[key] = aiohttp.ClientTimeout(
                sock_connect=key[0], sock_read=key[1], connect=key[2]
            )
        return timeout

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        if self._session is not None:
            await self._session.close()


def _raise_mapped(exc: Exception) -> NoReturn:
    """Raise ``exc`` as httpx-aiohttp would: its httpx counterpart, ``exc`` the cause."""
    import aiohttp  # a failure of the aiohttp session: loaded already
    from httpx_aiohttp.transport import map_aiohttp_exceptions

    if isinstance(exc, aiohttp.ClientResponseError):
        # An answer aiohttp could not parse (httpx-aiohttp leaves it unmapped).
        raise httpx.RemoteProtocolError(str(exc)) from exc
    with map_aiohttp_exceptions():
        raise exc
    raise AssertionError("unreachable")  # pragma: no cover


def create_transport(
    max_connections: int = 1000, keepalive: float = 30.0, lean: bool = True
) -> UpstreamTransport:
    """The transport for all upstream calls; create it inside the running event loop.
    ``lean`` False: the general client for every upstream (tests compare the two)."""

    def new_session() -> aiohttp.ClientSession:
        import aiohttp

        return aiohttp.ClientSession(
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

    return UpstreamTransport(new_session, LeanTransport(max_connections) if lean else None)
