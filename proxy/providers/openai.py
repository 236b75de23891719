"""OpenAI and OpenAI-compatible servers (vLLM, LiteLLM, Ollama...): ``{base_url}/{shape}``,
``Authorization: Bearer``, OpenAI's ``x-ratelimit-*`` headers (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.upstream.ratelimits import parse_budget

if TYPE_CHECKING:
    from proxy.config import Deployment
    from proxy.limiter.base import Outcome

__all__ = ["OPENAI", "OPENAI_SHAPES"]

OPENAI_SHAPES = frozenset(("chat/completions", "completions", "embeddings", "responses"))


class OpenAICompatible:
    name = "openai"
    shapes = OPENAI_SHAPES
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        return f"{deployment.base_url}/{shape}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("authorization", f"Bearer {key}") if key else None

    # Compatible servers in front of other APIs may pass Anthropic's headers on:
    # parse_budget reads both dialects. The function itself: a call less per answer.
    budget = staticmethod(parse_budget)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        return None  # the client's path is the proxy's: an error is about the request


OPENAI = OpenAICompatible()
