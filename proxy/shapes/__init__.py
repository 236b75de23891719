"""The API shapes the proxy serves, one module each, and the registry (path -> shape).

To serve a new API shape: its module here (a class following ``base.Shape``) and one line
in ``SHAPES``. Providers say which shapes they speak (``proxy/providers/``). A path with
a ``{name}`` placeholder is a pattern (``match``); the others are matched exactly
(``BY_PATH``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from proxy.shapes.base import AT_PATH, RequestTarget, Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.completions import COMPLETIONS
from proxy.shapes.count_tokens import COUNT_TOKENS
from proxy.shapes.embeddings import EMBEDDINGS
from proxy.shapes.gemini import GENERATE_CONTENT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES

__all__ = [
    "BY_NAME",
    "BY_PATH",
    "PATTERNS",
    "SHAPES",
    "Shape",
    "compile_path",
    "match",
    "registered",
    "surface",
]

SHAPES: tuple[Shape, ...] = (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    COUNT_TOKENS,
    RESPONSES,
    GENERATE_CONTENT,
)

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def compile_path(path: str) -> re.Pattern[str] | None:
    """A path template's pattern (each ``{name}`` one or more characters but ``/`` and
    ``:``, captured); None for a path with no placeholder (matched exactly)."""
    parts = _PLACEHOLDER.split(path)
    if len(parts) == 1:
        return None
    pattern = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/:]+)" for i, part in enumerate(parts)
    )
    return re.compile(pattern + r"\Z")


BY_PATH: dict[str, Shape] = {}
PATTERNS: list[tuple[re.Pattern[str], Shape]] = []
BY_NAME: dict[str, Shape] = {}
_STARTS: list[tuple[str, Shape]] = []  # each pattern's text before its first placeholder


def _index(shapes: tuple[Shape, ...]) -> None:
    BY_PATH.clear()
    PATTERNS.clear()
    BY_NAME.clear()
    _STARTS.clear()
    for shape in shapes:
        BY_NAME[shape.name] = shape
        for path in shape.paths:
            pattern = compile_path(path)
            if pattern is None:
                BY_PATH[path] = shape
            else:
                PATTERNS.append((pattern, shape))
                _STARTS.append((path.partition("{")[0], shape))


_index(SHAPES)


def match(path: str, query: str = "") -> tuple[Shape, RequestTarget] | None:
    """The shape served at ``path`` and what its URL says (its placeholders' values,
    ``query``); None: no shape is served there."""
    shape = BY_PATH.get(path)
    if shape is not None:
        return shape, AT_PATH if not query else RequestTarget({}, query)
    for pattern, patterned in PATTERNS:
        found = pattern.match(path)
        if found is not None:
            return patterned, RequestTarget(found.groupdict(), query)
    return None


@contextmanager
def registered(*shapes: Shape) -> Iterator[None]:
    """``shapes`` served beside the registered ones while the context lasts (an app made
    meanwhile serves them): what a test that defines a shape of its own uses."""
    global SHAPES
    kept = SHAPES
    SHAPES = (*kept, *shapes)
    _index(SHAPES)
    try:
        yield
    finally:
        SHAPES = kept
        _index(SHAPES)


def surface(path: str) -> Shape:
    """The shape whose error shape a path's answers take: the one served there, else one
    under whose path it lies (``/v1/messages/batches``: Anthropic's), else OpenAI's."""
    found = match(path)
    if found is not None:
        return found[0]
    shape = next((s for p, s in BY_PATH.items() if path.startswith(p + "/")), None)
    if shape is None:  # below a pattern's fixed start (``/v1beta/models/``): its shape's
        shape = next((s for p, s in _STARTS if path.startswith(p)), CHAT)
    return shape
