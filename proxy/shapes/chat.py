"""OpenAI's chat completions: ``POST /v1/chat/completions`` (pure)."""

from __future__ import annotations

from proxy.shapes.openai import OpenAIShape

__all__ = ["CHAT"]


class Chat(OpenAIShape):
    name = "chat/completions"
    paths = ("/v1/chat/completions",)


CHAT = Chat()
