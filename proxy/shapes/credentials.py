"""How clients present their key to the proxy (pure): one class per API.

Every client route takes the key in either form a served API's clients send it:
``Authorization: Bearer KEY`` (OpenAI's SDKs; Anthropic's with an auth token) or
``x-api-key: KEY`` (Anthropic's SDKs, Claude Code with ``ANTHROPIC_API_KEY``). They
differ only in which header counts when a request carries both (the API's own first)
and in what a request without either is told: OpenAI's APIs and the proxy's own routes
(models, stored responses) ``Bearer``, Anthropic's ``AnthropicKey``.
"""

from __future__ import annotations

from proxy.values import value

__all__ = ["ANTHROPIC_KEY", "BEARER", "AnthropicKey", "Bearer", "bearer_secret"]


def bearer_secret(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer SECRET`` header value (any case, spaces
    around it); None for another scheme or none."""
    if not authorization:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        return None
    return secret


def _secret(header: str, value: str | None) -> str | None:
    """The key in ``value`` of ``header``: ``x-api-key``'s whole (trimmed), a bearer's."""
    if header != "x-api-key":
        return bearer_secret(value)
    secret = (value or "").strip()
    return secret or None


@value
class Bearer:
    """``Authorization: Bearer KEY`` first (OpenAI's header), else ``x-api-key: KEY``."""

    headers: tuple[str, ...] = ("authorization", "x-api-key")
    query: tuple[str, ...] = ()
    missing: str = "Missing API key: send 'Authorization: Bearer YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        return _secret(header, value)


BEARER = Bearer()


@value
class AnthropicKey:
    """``x-api-key: KEY`` first (Anthropic's own header), else ``Authorization: Bearer``."""

    headers: tuple[str, ...] = ("x-api-key", "authorization")
    query: tuple[str, ...] = ()
    missing: str = "Missing API key: send 'x-api-key: YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        return _secret(header, value)


ANTHROPIC_KEY = AnthropicKey()
