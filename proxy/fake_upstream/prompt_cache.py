"""The fake's prompt cache for the Messages API (`prompt_cache: true`), pure: the caller
passes the time.

As Anthropic's (https://docs.claude.com/en/docs/build-with-claude/prompt-caching): a
block marked `cache_control` (or the last block, with the request's top-level
`cache_control`) is a breakpoint; the prompt is read in the order tools, system,
messages, and once a request is admitted each breakpoint's prefix is cached for 5 minutes
(an hour with `"ttl": "1h"`), renewed by each use. A later request reads from the cache
the longest prefix it shares with a cached one, ending at one of its block boundaries up
to 20 blocks before one of its breakpoints: `cache_read_input_tokens`. What it then caches
up to its last breakpoint is written: `cache_creation_input_tokens`; the rest is
`input_tokens`. Its input window (`itpm`) counts the last two, not the reads.

Tokens are the fake's chat estimate (`bodies.estimate_chat_prompt_tokens`): a prefix is
the characters of its text blocks / 4, rounded up, plus 3 for each message it reaches
(the system prompt is one) and 3; the tools count nothing, as in the whole estimate, but
are part of every prefix. Unlike Anthropic's, any length is cached (no minimum), and an
entry is readable as soon as its request is admitted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

LOOKBACK = 20
TTL = 300.0
LONG_TTL = 3600.0


@dataclass(frozen=True, slots=True)
class Boundary:
    digest: bytes
    tokens: int  # the prefix's input tokens, ending with this block


@dataclass(frozen=True, slots=True)
class Split:
    """A request's input as the cache serves it."""

    read: int  # tokens read from the cache
    written: int  # tokens written to it
    entries: tuple[tuple[bytes, float], ...]  # what to cache once admitted (digest, ttl)


class PromptCache:
    """Cached prefixes, by digest, until when (seconds on the caller's clock)."""

    def __init__(self) -> None:
        self._until: dict[bytes, float] = {}

    def clear(self) -> None:
        self._until.clear()

    def split(self, body: dict[str, Any], now: float) -> Split | None:
        """How much of `body`'s input the cache serves now (None: it marks no
        breakpoint). Nothing is cached yet: `store` its entries once it is admitted."""
        boundaries, marks = _boundaries(body)
        if not marks:
            return None
        near = sorted({j for i, _ in marks for j in range(max(0, i - LOOKBACK), i + 1)})
        hit = next(
            (j for j in reversed(near) if self._until.get(boundaries[j].digest, 0.0) > now), None
        )
        read = 0 if hit is None else boundaries[hit].tokens
        last = max(i for i, _ in marks)
        written = max(boundaries[last].tokens - read, 0)
        entries = [(boundaries[i].digest, ttl) for i, ttl in marks]
        if hit is not None:  # a use renews it
            entries.append((boundaries[hit].digest, TTL))
        return Split(read, written, tuple(entries))

    def store(self, entries: tuple[tuple[bytes, float], ...], now: float) -> None:
        for digest, ttl in entries:
            self._until[digest] = max(self._until.get(digest, 0.0), now + ttl)
        if len(self._until) > 100_000:  # a long run: drop what has expired
            self._until = {d: t for d, t in self._until.items() if t > now}


def _boundaries(body: dict[str, Any]) -> tuple[list[Boundary], list[tuple[int, float]]]:
    model = body.get("model")
    running = hashlib.sha256(str(model).encode())
    chars, messages = 0, 0
    boundaries: list[Boundary] = []
    marks: list[tuple[int, float]] = []
    for tag, block, starts_message in _blocks(body):
        running.update(tag + orjson.dumps(_unmarked(block), option=orjson.OPT_SORT_KEYS))
        messages += starts_message
        if isinstance(block, dict) and isinstance(block.get("text"), str) and tag != b"t":
            chars += len(block["text"])
        tokens = math.ceil(chars / 4) + 3 * messages + 3
        boundaries.append(Boundary(running.digest(), tokens))
        control = block.get("cache_control") if isinstance(block, dict) else None
        if isinstance(control, dict):
            marks.append((len(boundaries) - 1, _ttl(control)))
    control = body.get("cache_control")
    if isinstance(control, dict) and boundaries:
        marks.append((len(boundaries) - 1, _ttl(control)))
    return boundaries, marks


def _blocks(body: dict[str, Any]) -> Iterator[tuple[bytes, Any, int]]:
    """(tag, block, 1 if it starts a message) in the cache's order."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        yield b"t", tool, 0
    system = body.get("system")
    if system is not None:
        for i, block in enumerate(_as_blocks(system)):
            yield b"s", block, int(i == 0)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            role = str(message.get("role")).encode()
            for i, block in enumerate(_as_blocks(message.get("content"))):
                yield b"m" + role, block, int(i == 0)


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _unmarked(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _ttl(control: dict[str, Any]) -> float:
    return LONG_TTL if control.get("ttl") == "1h" else TTL
