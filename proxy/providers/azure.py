"""Azure OpenAI: ``{base_url}/openai/deployments/{deployment}/{shape}?api-version=...``
(the Responses API: ``{base_url}/openai/v1/responses``, the v1 API, which takes no
api-version and names the Azure deployment in the body's ``model``), ``api-key``, its
part of OpenAI's rate-limit headers, its way of counting tokens toward its limits, and its
answers that say the deployment's name or api-version is wrong (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.costs import Counting
from proxy.limiter.base import Outcome
from proxy.providers.openai import OPENAI_SHAPES
from proxy.providers.ratelimits import UpstreamBudget, parse_budget

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.providers.base import Wire

__all__ = ["AZURE", "AZURE_COUNTING"]

# What Azure says of an api-version it does not serve (a 400 otherwise like the client's).
_VERSION_REFUSED = b"API version not supported"
# Azure's own errors are ``{"error": {"code", "message"}}``; the API's (OpenAI's shape)
# have a ``type``: a 404 of these is about the request (a stored response it lacks).
_OPENAI_ERROR = b'"type"'
# Served only by Azure's v1 API (learn.microsoft.com, "Azure OpenAI Responses API").
_V1_SHAPES = frozenset(("responses",))

# How Azure OpenAI's TPM counts a request, https://learn.microsoft.com/en-us/azure/
# ai-foundry/openai/how-to/quota ("Understanding rate limits"): "As each request is
# received, Azure OpenAI computes an estimated max processed-token count that includes
# ... prompt text and count, the max_tokens parameter setting, the best_of parameter
# setting", added to a running count "reset each minute", and "it isn't the same as the
# token count used for billing":
# - at admission, the prompt and `max_tokens` (times the choices): the proxy's estimate
#   is the same sum (`max_tokens`, `max_completion_tokens` or `max_output_tokens`, times
#   `n`; without one, `server.default_max_tokens`, where Azure reserves more);
# - cached prompt tokens count: the estimate is made as the request arrives, before any
#   cache is read, from the whole prompt text (a cached token is part of `prompt_tokens`);
# - after the answer: nothing is given back (the running count keeps the estimate, the
#   unused part of `max_tokens` included); charged more only when the usage says more
#   (not adjusted).
AZURE_COUNTING = Counting(cache_reads=True, adjusted=False)


class AzureOpenAI:
    name = "azure"
    shapes = OPENAI_SHAPES
    counting = AZURE_COUNTING
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        if shape in _V1_SHAPES:
            return f"{deployment.base_url}/openai/v1/{shape}"
        base = f"{deployment.base_url}/openai/deployments/{deployment.deployment}"
        return f"{base}/{shape}?api-version={deployment.api_version}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return deployment.deployment if shape in _V1_SHAPES else None

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("api-key", key) if key else None

    def wire(self, deployment: Deployment) -> Wire | None:
        return None  # its shapes' JSON, POSTed to ``url`` with ``credential``

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return parse_budget(headers, now)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """Its path (deployment name, api-version) comes from the config: its 404 (no such
        deployment, no api-version) and its 400 of an unsupported api-version are never
        the client's fault. A 404 of another kind (a stored response it does not have,
        in OpenAI's error shape) is the client's answer."""
        if status not in (400, 404):
            return None
        head = body[:1024]
        if status == 400 and _VERSION_REFUSED not in head:
            return None
        if status == 404 and _OPENAI_ERROR in head:
            return None
        return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


AZURE = AzureOpenAI()
