"""The upstream dialects the proxy speaks, one module each, and the registry by the
config's ``provider`` name.

To speak a new provider: its module here (a class following ``base.Provider``), one line
in ``PROVIDERS``, and its name in ``config.PROVIDER_NAMES`` (the config's schema); or,
from outside the package, ``register`` (tests/recipes/test_provider_recipe.py).
"""

from __future__ import annotations

from proxy.config.settings import PROVIDER_NAMES
from proxy.providers.anthropic import ANTHROPIC
from proxy.providers.azure import AZURE
from proxy.providers.base import Provider
from proxy.providers.bedrock import BEDROCK, BEDROCK_CONVERSE
from proxy.providers.gemini import GEMINI
from proxy.providers.openai import OPENAI
from proxy.providers.vertex import VERTEX

__all__ = ["PROVIDERS", "Provider", "provider_of", "register"]

PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        OPENAI,
        AZURE,
        ANTHROPIC,
        GEMINI,
        VERTEX,
        BEDROCK,
        BEDROCK_CONVERSE,
    )
}


def provider_of(name: str) -> Provider:
    """The provider the config names (validated: config.Provider)."""
    return PROVIDERS[name]


def register(provider: Provider) -> None:
    """A provider defined outside this package (a plugin, a test's): the config takes
    its name for ``provider:`` from now on (configs read before do not change)."""
    PROVIDERS[provider.name] = provider
    if provider.name not in PROVIDER_NAMES:
        PROVIDER_NAMES.append(provider.name)
