"""OpenAI and OpenAI-compatible servers (vLLM, LiteLLM, Ollama...): ``{base_url}/{shape}``,
``Authorization: Bearer``, OpenAI's ``x-ratelimit-*`` headers, OpenAI's way of counting
tokens toward its limits (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.costs import Counting
from proxy.providers.ratelimits import parse_budget

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.limiter.base import Outcome
    from proxy.providers.base import Wire

__all__ = ["OPENAI", "OPENAI_COUNTING", "OPENAI_SHAPES"]

OPENAI_SHAPES = frozenset(("chat/completions", "completions", "embeddings", "responses"))

# How OpenAI's TPM counts a request (its window kinds: requests and tokens):
# - cached prompt tokens count: prompt caching lowers the price and the latency, not what
#   a prompt costs the rate limit (the guide's FAQ on rate limits),
#   https://platform.openai.com/docs/guides/prompt-caching. A cached token is part of
#   `prompt_tokens` (`prompt_tokens_details.cached_tokens`): the prompt counts whole;
# - at admission, the prompt and the output cap: the limit is measured with the larger
#   of `max_tokens` and the prompt estimated from its characters (the guide's error
#   mitigation section), https://platform.openai.com/docs/guides/rate-limits. The proxy
#   reserves both, prompt plus cap: never less than OpenAI counts;
# - after the answer: OpenAI documents no adjustment, so the estimate stands and a
#   request is charged more only when its usage says more (not adjusted).
# An OpenAI-compatible server limits as it likes; OpenAI's rule is the default.
OPENAI_COUNTING = Counting(cache_reads=True, adjusted=False)


class OpenAICompatible:
    name = "openai"
    shapes = OPENAI_SHAPES
    counting = OPENAI_COUNTING
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        return f"{deployment.base_url}/{shape}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("authorization", f"Bearer {key}") if key else None

    def wire(self, deployment: Deployment) -> Wire | None:
        return None  # its shapes' JSON, POSTed to ``url`` with ``credential``

    # Compatible servers in front of other APIs may pass Anthropic's headers on:
    # parse_budget reads both dialects. The function itself: a call less per answer.
    budget = staticmethod(parse_budget)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        return None  # the client's path is the proxy's: an error is about the request


OPENAI = OpenAICompatible()
