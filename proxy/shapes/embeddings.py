"""OpenAI's embeddings: ``POST /v1/embeddings`` (pure). An embedding writes no output
tokens: its cost is its input."""

from __future__ import annotations

from typing import Any

from proxy.costs import Cost, estimate_cost
from proxy.shapes.openai import OpenAIShape
from proxy.shapes.tokens import prompt_tokens

__all__ = ["EMBEDDINGS"]


class Embeddings(OpenAIShape):
    name = "embeddings"
    paths = ("/v1/embeddings",)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        return estimate_cost(prompt_tokens(body))


EMBEDDINGS = Embeddings()
