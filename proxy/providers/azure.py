"""Azure OpenAI: ``{base_url}/openai/deployments/{deployment}/{shape}?api-version=...``,
``api-key``, its part of OpenAI's rate-limit headers, and its answers that say the
deployment's name or api-version is wrong (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.limiter.base import Outcome
from proxy.providers.openai import OPENAI_SHAPES
from proxy.upstream.ratelimits import UpstreamBudget, parse_budget

if TYPE_CHECKING:
    from proxy.config import Deployment

__all__ = ["AZURE"]

# What Azure says of an api-version it does not serve (a 400 otherwise like the client's).
_VERSION_REFUSED = b"API version not supported"


class AzureOpenAI:
    name = "azure"
    shapes = OPENAI_SHAPES

    def url(self, deployment: Deployment, shape: str) -> str:
        base = f"{deployment.base_url}/openai/deployments/{deployment.deployment}"
        return f"{base}/{shape}?api-version={deployment.api_version}"

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("api-key", key) if key else None

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return parse_budget(headers, now)

    def misconfigured(self, status: int, body: bytes, cooldown_time: float) -> Outcome | None:
        """Its path (deployment name, api-version) comes from the config: its 404 (no such
        deployment, no api-version) and its 400 of an unsupported api-version are never
        the client's fault."""
        if status not in (400, 404):
            return None
        if status == 400 and _VERSION_REFUSED not in body[:1024]:
            return None
        return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


AZURE = AzureOpenAI()
