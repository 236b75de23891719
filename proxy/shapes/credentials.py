"""How clients present their key to the proxy (pure): one class per scheme.

Today ``Authorization: Bearer KEY`` (OpenAI's APIs, and the proxy's own routes); a shape
whose clients send their key otherwise (Anthropic's ``x-api-key``) adds its class here.
"""

from __future__ import annotations

from proxy.values import value

__all__ = ["BEARER", "Bearer", "bearer_secret"]


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
    header: str = "authorization"
    missing: str = "Missing API key: send 'Authorization: Bearer YOUR_KEY'."

    def secret(self, value: str | None) -> str | None:
        return bearer_secret(value)


BEARER = Bearer()
