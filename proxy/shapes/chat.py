"""OpenAI's chat completions: ``POST /v1/chat/completions`` (pure)."""

from __future__ import annotations

from proxy.shapes.openai import OpenAIShape
from proxy.shapes.output_caps import CHAT_CAPS

__all__ = ["CHAT"]


class Chat(OpenAIShape):
    name = "chat/completions"
    paths = ("/v1/chat/completions",)
    output_caps = CHAT_CAPS


CHAT = Chat()
