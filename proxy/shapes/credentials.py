"""How clients present their key to the proxy (pure): one class per scheme.

``Authorization: Bearer KEY`` (OpenAI's APIs, and the proxy's own routes), and
Anthropic's ``x-api-key: KEY`` or the bearer form (current Anthropic SDKs send either).
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


@value
class Bearer:
    headers: tuple[str, ...] = ("authorization",)
    missing: str = "Missing API key: send 'Authorization: Bearer YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        return bearer_secret(value)


BEARER = Bearer()


@value
class AnthropicKey:
    """``x-api-key: KEY`` first (Anthropic's own header), else ``Authorization: Bearer``."""

    headers: tuple[str, ...] = ("x-api-key", "authorization")
    missing: str = "Missing API key: send 'x-api-key: YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        if header != "x-api-key":
            return bearer_secret(value)
        secret = (value or "").strip()
        return secret or None


ANTHROPIC_KEY = AnthropicKey()
