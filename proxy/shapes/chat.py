"""OpenAI's chat completions: ``POST /v1/chat/completions`` (pure)."""

from __future__ import annotations

from proxy.output_caps import CHAT_CAPS
from proxy.shapes.openai import OpenAIShape

__all__ = ["CHAT"]


class Chat(OpenAIShape):
    name = "chat/completions"
    paths = ("/v1/chat/completions",)
    output_caps = CHAT_CAPS


CHAT = Chat()
