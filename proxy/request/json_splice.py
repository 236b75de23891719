"""Top-level fields of a JSON object replaced in its bytes, without re-serializing the
rest (pure).

A body the proxy must change (the deployment's own ``model``, ``stream_options``) is
normally parsed and dumped again; orjson refuses to dump what nests deeper than 255
levels, which a client may send (and orjson parses). Then only the fields that change
are spliced into the client's bytes: the rest goes upstream as it came.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

__all__ = ["set_fields"]

# A string (escapes included) or a structural character: enough to find where each
# top-level member's value begins and ends. Numbers and literals lie between them.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]', re.DOTALL)


def set_fields(raw: bytes, fields: Mapping[str, object]) -> bytes:
    """``raw`` (a valid JSON object) with each of ``fields`` set at the top level: every
    occurrence of the key replaced, a missing key added at the end."""
    values = {name: orjson.dumps(value) for name, value in fields.items()}
    members, close = _top_level_members(raw)
    parts: list[bytes] = []
    done = 0  # bytes of raw already copied to parts
    for key, value_start, value_end in members:
        if key in values:
            parts += [raw[done:value_start], values[key]]
            done = value_end
    found = {key for key, _, _ in members}
    missing = [name for name in values if name not in found]
    if not missing:
        return b"".join([*parts, raw[done:]])
    added = _added_members(raw, close, {name: values[name] for name in missing})
    return b"".join([*parts, raw[done:close], added, raw[close:]])


# How far a structural token takes the depth.
_DEPTH = {b"{": 1, b"[": 1, b"}": -1, b"]": -1}


def _top_level_members(raw: bytes) -> tuple[list[tuple[str, int, int]], int]:
    """Each top-level member of the object ``raw`` as its key and where its value's bytes
    begin and end (in order, a repeated key each time), and where the object closes."""
    members: list[tuple[str, int, int]] = []
    depth = 0
    key: str | None = None  # the member whose value is being read, at depth 1
    value_start = 0
    last_token = b""
    for match in _TOKEN.finditer(raw):
        token = match.group()
        step = _DEPTH.get(token, 0)
        depth += step
        if depth == 1 and token == b":":
            key = orjson.loads(last_token)
            value_start = match.end()
        elif key is not None and _ends_member(token, depth):
            members.append((key, value_start, match.start()))
            key = None
        if step < 0 and depth == 0:
            return members, match.start()
        last_token = token
    return members, -1


def _ends_member(token: bytes, depth: int) -> bool:
    """Whether ``token`` (the depth counted with it) ends a top-level member's value: the
    comma before the next member, or the object's closing brace."""
    return (depth == 1 and token == b",") or (depth == 0 and token == b"}")


def _added_members(raw: bytes, close: int, added: Mapping[str, bytes]) -> bytes:
    """The members ``added`` (a name and its JSON), written before the object's closing
    brace at ``close``: after a comma unless the object is empty."""
    empty = raw[:close].rstrip().endswith(b"{")
    members = b",".join(orjson.dumps(name) + b":" + value for name, value in added.items())
    return members if empty else b"," + members
