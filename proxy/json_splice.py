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
    parts: list[bytes] = []
    done = 0  # bytes of raw already copied to parts
    found: set[str] = set()
    depth = 0
    key: str | None = None  # the member whose value is being read, at depth 1
    value_start = 0
    last_token = b""
    close = -1
    for match in _TOKEN.finditer(raw):
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                close = match.start()
        if depth == 1 and token == b":":
            key = orjson.loads(last_token)
            value_start = match.end()
        elif key is not None and ((depth == 1 and token == b",") or (depth == 0 and token == b"}")):
            if key in values:
                parts.append(raw[done:value_start])
                parts.append(values[key])
                done = match.start()
                found.add(key)
            key = None
        last_token = token
        if close >= 0:
            break
    missing = [name for name in values if name not in found]
    if not missing:
        return b"".join([*parts, raw[done:]])
    empty = raw[:close].rstrip().endswith(b"{")
    added = b",".join(orjson.dumps(name) + b":" + values[name] for name in missing)
    return b"".join([*parts, raw[done:close], b"" if empty else b",", added, raw[close:]])
