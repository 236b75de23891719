"""The upstream dialects the proxy speaks, one module each, and the registry by the
config's ``provider`` name.

To speak a new provider: its module here (a class following ``base.Provider``), one line
in ``PROVIDERS``, and its name in ``config.Provider`` (the config's schema).
"""

from __future__ import annotations

from proxy.providers.anthropic import ANTHROPIC
from proxy.providers.azure import AZURE
from proxy.providers.base import Provider
from proxy.providers.bedrock import BEDROCK
from proxy.providers.openai import OPENAI

__all__ = ["PROVIDERS", "Provider", "provider_of"]

PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        OPENAI,
        AZURE,
        ANTHROPIC,
        BEDROCK,
    )
}


def provider_of(name: str) -> Provider:
    """The provider the config names (validated: config.Provider)."""
    return PROVIDERS[name]
