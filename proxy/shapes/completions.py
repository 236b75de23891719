"""OpenAI's (legacy) completions: ``POST /v1/completions`` (pure)."""

from __future__ import annotations

from proxy.shapes.openai import OpenAIShape

__all__ = ["COMPLETIONS"]


class Completions(OpenAIShape):
    name = "completions"
    paths = ("/v1/completions",)


COMPLETIONS = Completions()
