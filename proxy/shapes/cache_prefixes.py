"""Where a Messages request may be read from Anthropic's prompt cache (pure).

Anthropic caches a prompt's prefix up to each block marked ``cache_control`` (a
breakpoint; a request's top-level ``cache_control`` puts one on its last block), the
prompt read in the order tools, system, messages. A later request whose prompt starts with
the same blocks, within the entry's lifetime (5 minutes, an hour with ``"ttl": "1h"``,
renewed by each use), reads them from the cache: a hit is looked for at each block
boundary up to 20 blocks before each of its breakpoints.
https://docs.claude.com/en/docs/build-with-claude/prompt-caching

``prefixes`` fingerprints a request's prompt at those places: each breakpoint's prefix
(cached once an answer reports cache use) and each boundary a hit may be found at (looked
up by later requests), each with the proxy's estimate of the prefix's tokens, on the scale
of its estimate of the whole input (``tokens.messages_input_tokens``): what is left is its
estimate of what the cache does not serve. A block's fingerprint leaves its
``cache_control`` out (a breakpoint moved along a conversation leaves the blocks before it
as they were), and a text given as a string is that text as one block. The fingerprints
start with the request's model (a cache is a model's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

from proxy.shapes.tokens import PER_MESSAGE, PER_REQUEST, block_tokens, json_tokens
from proxy.values import value

__all__ = ["LOOKBACK", "CachePrefixes", "Prefix", "prefixes"]

LOOKBACK = 20  # block boundaries before a breakpoint where a hit is looked for
TTL = 300.0  # seconds an entry lives unused (Anthropic's default, "5m")
LONG_TTL = 3600.0  # with "ttl": "1h"
_MARK = b"cache_control"


@value
class Prefix:
    """A prompt's beginning, up to and including one block: its fingerprint and the
    proxy's estimate of its input tokens."""

    digest: bytes
    tokens: int


@value
class CachePrefixes:
    """A request's prompt where the cache may serve it. ``breakpoints``: each marked
    prefix with its lifetime in seconds (what an answer that reports cache use shows
    cached); ``lookups``: the boundaries a hit may be found at, the longest first."""

    breakpoints: tuple[tuple[Prefix, float], ...]
    lookups: tuple[Prefix, ...]


def prefixes(body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
    """The cacheable prefixes of a Messages request (``raw``: its bytes); None when it
    marks no breakpoint (the cache is only used where the client asks for it)."""
    if _MARK not in raw:
        return None  # the common case, told without a walk
    try:
        return _walk(body)
    except orjson.JSONEncodeError:  # a block nested deeper than orjson writes: no guess
        return None


def _walk(body: dict[str, Any]) -> CachePrefixes | None:
    model = body.get("model")
    running = hashlib.blake2b(model.encode() if isinstance(model, str) else b"", digest_size=16)
    tokens = PER_REQUEST
    seen: list[Prefix] = []
    marks: list[tuple[int, float]] = []
    for tag, block, added in _blocks(body):
        running.update(tag)
        running.update(orjson.dumps(_unmarked(block), option=orjson.OPT_SORT_KEYS))
        tokens += added
        seen.append(Prefix(running.digest(), tokens))
        ttl = _ttl(block)
        if ttl:
            marks.append((len(seen) - 1, ttl))
    ttl = _ttl(body)  # automatic caching: the last block
    if ttl and seen:
        marks.append((len(seen) - 1, ttl))
    return _marked(seen, marks) if marks else None


def _marked(seen: list[Prefix], marks: list[tuple[int, float]]) -> CachePrefixes:
    """The breakpoints ``marks`` (index in ``seen``, lifetime) and where hits are looked
    for before each."""
    near = {j for i, _ in marks for j in range(max(0, i - LOOKBACK), i + 1)}
    return CachePrefixes(
        tuple((seen[i], ttl) for i, ttl in marks),
        tuple(seen[j] for j in sorted(near, reverse=True)),
    )


def _blocks(body: dict[str, Any]) -> Iterator[tuple[bytes, Any, int]]:
    """The prompt's blocks in the cache's order, each with its tag (what it is part of)
    and the tokens it adds to the estimate. The tools are estimated together, as the
    whole input's estimate does, on the last of them (a prefix ending among them is
    estimated low: never more of the input than the cache can serve)."""
    tools = body.get("tools")
    if isinstance(tools, list):
        last = len(tools) - 1
        for i, tool in enumerate(tools):
            yield b"\x01t", tool, json_tokens(tools) if i == last else 0
    system = body.get("system")
    if system is not None:
        yield from _message_blocks(b"\x01s", system)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            role = message.get("role")
            start = b"\x01M" + (role.encode() if isinstance(role, str) else b"")
            yield from _message_blocks(start, message.get("content"))


def _message_blocks(start: bytes, content: Any) -> Iterator[tuple[bytes, Any, int]]:
    """A message's blocks (the system prompt is one more message): the first tagged
    ``start`` and counting the message's framing, the others tagged as its own."""
    for i, block in enumerate(_as_blocks(content)):
        tag, framing = (start, PER_MESSAGE) if i == 0 else (b"\x01m", 0)
        yield tag, block, framing + block_tokens(block)


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return [] if content is None else [content]


def _unmarked(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _ttl(block: Any) -> float:
    """The lifetime of the cache entry ``block`` marks (0: it marks none)."""
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return 0.0
    return LONG_TTL if control.get("ttl") == "1h" else TTL
