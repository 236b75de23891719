"""OpenAI's (legacy) completions: ``POST /v1/completions`` (pure)."""

from __future__ import annotations

from proxy.shapes.openai import OpenAIShape
from proxy.shapes.output_caps import COMPLETIONS_CAPS

__all__ = ["COMPLETIONS"]


class Completions(OpenAIShape):
    name = "completions"
    paths = ("/v1/completions",)
    output_caps = COMPLETIONS_CAPS


COMPLETIONS = Completions()
