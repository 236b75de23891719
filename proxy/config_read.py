"""Reading a large config file in a child process, for a reload.

libyaml parses a whole document in one call that holds the GIL: a file of 100,000 client
keys held it about 2 s, and the event loop with it, even from a thread. A file over
``APART_OVER`` bytes is therefore parsed by a child interpreter (``python -c``, this
package only), which hands the document back as JSON lines, the keys a thousand to a
line, each read here in well under a millisecond; the caller validates it in its thread
(``config.parse_settings``). A smaller file is read in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from proxy.config import ConfigError, read_document

__all__ = ["APART_OVER", "read_document_apart"]

APART_OVER = 1 << 20  # bytes: about 15,000 keys
_KEYS_A_LINE = 1000
_TIMEOUT = 600.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def read_document_apart(path: str) -> Any:
    """The document of ``path`` (as ``config.read_document``), parsed apart if large."""
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    if size <= APART_OVER:
        return read_document(path)
    env = {**os.environ, "PYTHONPATH": _PACKAGE_ROOT}
    child = subprocess.run(
        [sys.executable, "-c", "from proxy.config_read import _child; _child()", path],
        capture_output=True,
        timeout=_TIMEOUT,
        env=env,
        check=False,
    )
    lines = child.stdout.splitlines()
    if child.returncode != 0 or not lines:
        detail = child.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ConfigError(path, [f"cannot read the file: {' '.join(detail) or 'no output'}"])
    head = orjson.loads(lines[0])
    if head.get("in_place"):
        return read_document(path)
    if "problems" in head:
        raise ConfigError(path, list(head["problems"]))
    document = head["document"]
    if head["keys"] is not None:
        document["keys"] = [key for line in lines[1:] for key in orjson.loads(line)]
    return document


def _child() -> None:
    """In the child: the document of ``sys.argv[1]`` as JSON lines on stdout."""
    out = sys.stdout.buffer
    try:
        document = read_document(sys.argv[1])
    except ConfigError as exc:
        out.write(orjson.dumps({"problems": exc.problems}) + b"\n")
        return
    keys: list[Any] | None = None
    if isinstance(document, dict) and isinstance(document.get("keys"), list):
        keys = document.pop("keys")
    try:
        head = {"document": document, "keys": None if keys is None else len(keys)}
        lines = [_dumps(head)]
        for start in range(0, len(keys or []), _KEYS_A_LINE):
            lines.append(_dumps((keys or [])[start : start + _KEYS_A_LINE]))
    except TypeError:  # not plain JSON (a YAML date, binary, a number as a mapping key)
        out.write(orjson.dumps({"in_place": True}) + b"\n")
        return
    out.write(b"\n".join(lines) + b"\n")


def _dumps(value: Any) -> bytes:
    """JSON of exactly what YAML gave: a date or a non-string key is refused, not turned
    into a string (then the parent reads the file itself, as before)."""
    return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_DATETIME)
