"""Anthropic: ``{base_url}/v1/messages`` (and ``/v1/messages/count_tokens``),
``x-api-key``, ``anthropic-version`` (the client's, else ``DEFAULT_VERSION``), Anthropic's
``anthropic-ratelimit-*`` headers, its way of counting tokens toward its limits; its
answer that the deployment's model does not exist is the config's fault (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.costs import Counting
from proxy.limiter.base import Outcome
from proxy.providers.ratelimits import UpstreamBudget, anthropic_budget

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.providers.base import Wire

__all__ = ["ANTHROPIC", "ANTHROPIC_COUNTING", "ANTHROPIC_SHAPES", "DEFAULT_VERSION"]

ANTHROPIC_SHAPES = frozenset(("messages", "messages/count_tokens"))

# The API version sent when the client names none (the one Anthropic has served since).
DEFAULT_VERSION = "2023-06-01"

# How Anthropic's limits count a request (requests, input tokens and output tokens per
# minute apart: RPM, ITPM, OTPM), https://docs.claude.com/en/api/rate-limits:
# - input ("cache-aware ITPM"): `input_tokens` (uncached) and
#   `cache_creation_input_tokens` count; `cache_read_input_tokens` do not, for current
#   models (a few older ones, marked there, counted them). So a prompt the client caches
#   costs its input limit only what is not read from the cache: at admission the proxy
#   leaves out the cache reads it expects (what the deployment's answers showed cached,
#   `routing/prompt_caches.py`), and after the answer counts what it reports;
# - output: "OTPM rate limits are estimated based on max_tokens at the beginning of each
#   request and adjusted at the end of the request to reflect the actual number of output
#   tokens used": `max_tokens` at admission, the real output after (adjusted);
# - a deployment's `tokens` window (Anthropic has no combined limit) counts the two
#   together, cache reads left out as its input limit leaves them.
ANTHROPIC_COUNTING = Counting(cache_reads=False, adjusted=True)


class Anthropic:
    name = "anthropic"
    shapes = ANTHROPIC_SHAPES
    counting = ANTHROPIC_COUNTING
    default_headers = (("anthropic-version", DEFAULT_VERSION),)

    def url(self, deployment: Deployment, shape: str) -> str:
        return f"{deployment.base_url}/v1/{shape}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None  # the deployment's model, as configured

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("x-api-key", key) if key else None

    def wire(self, deployment: Deployment) -> Wire | None:
        return None  # its shapes' JSON, POSTed to ``url`` with ``credential``

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return anthropic_budget(headers, now)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """The path is the proxy's and the model the deployment's (``model:``): an
        Anthropic 404 (``not_found_error``) says one of them is wrong, never the client,
        unless the model was the client's own name (``asked``): then it is the client's
        answer (a deployment cooled for any name a client makes up would be a way to
        take it out). Its 401 and 403 are a bad key, cooled as any upstream's are
        (outcomes)."""
        if status != 404 or asked or b"not_found_error" not in body[:1024]:
            return None
        return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


ANTHROPIC = Anthropic()
