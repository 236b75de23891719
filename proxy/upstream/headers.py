"""Which headers cross the proxy, in each direction (pure)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["request_headers", "response_headers"]

# RFC 9110 hop-by-hop headers, plus what the proxy sets itself or must never forward:
# the client's credentials in any scheme, OpenAI's or Azure's (the upstream gets the
# deployment's key instead).
_DROP_REQUEST = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",  # the proxy has the whole body before it forwards: nothing to wait for
        "accept-encoding",
        "authorization",
        "api-key",
        "x-api-key",
        "cookie",
        "x-request-id",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        # Who is billed is the deployment's choice, never the client's: these reach the
        # upstream only as the deployment's own ``headers``.
        "openai-organization",
        "openai-project",
    }
)

# Upstream response headers worth passing back; the upstream's own rate-limit headers
# describe the deployment's budget, not the client's, so the proxy replaces them.
_PASS_RESPONSE = frozenset(
    {
        "content-type",
        "openai-processing-ms",
        "openai-version",
        "openai-model",
    }
)


def request_headers(
    client_headers: Iterable[tuple[str, str]],
    credential: tuple[str, str] | None,
    extra: Iterable[tuple[str, str]] = (),
    defaults: Iterable[tuple[str, str]] = (),
) -> dict[str, str]:
    """Headers for the upstream request: the client's, minus the dropped ones and those
    its ``Connection`` header names (hop-by-hop too, RFC 9110 7.6.1: ``HTTP2-Settings``
    of an h2c upgrade); then the deployment's own ``extra`` ones (config: never the
    credential or framing); then its ``credential`` (``("authorization", "Bearer
    sk-...")``, Azure's ``("api-key", ...)``, Anthropic's ``("x-api-key", ...)``; None:
    no key). ``defaults``: the provider's headers for a client that sent none of that
    name (Anthropic's ``anthropic-version``)."""
    drop = _DROP_REQUEST
    for name, value in client_headers:
        if name.lower() == "connection":  # usually "keep-alive", dropped anyway
            named = {token.strip().lower() for token in value.split(",")} - _DROP_REQUEST
            if named:
                drop = drop | named
    headers = {name: value for name, value in client_headers if name.lower() not in drop}
    for name, value in defaults:
        if not any(sent.lower() == name for sent in headers):
            headers[name] = value
    for name, value in extra:
        headers[name.lower()] = value
    headers["accept-encoding"] = "identity"
    if credential is not None:
        headers[credential[0]] = credential[1]
    return headers


def response_headers(upstream_headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers from the upstream response that the client gets."""
    return {name: value for name, value in upstream_headers if name.lower() in _PASS_RESPONSE}
