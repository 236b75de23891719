"""The API shapes the proxy serves, one module each, and the registry (path -> shape).

To serve a new API shape: its module here (a class following ``base.Shape``) and one line
in ``SHAPES``. Providers say which shapes they speak (``proxy/providers/``).
"""

from __future__ import annotations

from proxy.shapes.base import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.completions import COMPLETIONS
from proxy.shapes.count_tokens import COUNT_TOKENS
from proxy.shapes.embeddings import EMBEDDINGS
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES

__all__ = ["BY_NAME", "BY_PATH", "SHAPES", "Shape", "surface"]

SHAPES: tuple[Shape, ...] = (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    COUNT_TOKENS,
    RESPONSES,
)

BY_PATH: dict[str, Shape] = {path: shape for shape in SHAPES for path in shape.paths}
BY_NAME: dict[str, Shape] = {shape.name: shape for shape in SHAPES}


def surface(path: str) -> Shape:
    """The shape whose error shape a path's answers take: the one served there, else one
    under whose path it lies (``/v1/messages/batches``: Anthropic's), else OpenAI's."""
    shape = BY_PATH.get(path)
    if shape is None:
        shape = next((s for p, s in BY_PATH.items() if path.startswith(p + "/")), CHAT)
    return shape
