"""Reading a large config file in a child process, for a reload.

libyaml parses a whole document in one call that holds the GIL: a file of 100,000 client
keys held it about 2 s, and the event loop with it, even from a thread. A file over
``APART_OVER`` bytes is therefore parsed by a child interpreter (``python -c``, with
only PyYAML, orjson and ``yaml_load`` imported), which hands the document back as JSON
lines, the keys a thousand to a line, each read here in well under a millisecond; the
caller validates it (``config.parse_settings``). A smaller file is read in place, and so
is one the child cannot hand back exactly (a date, a non-string key, a number JSON
cannot carry: orjson would write NaN or infinity as null).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import orjson
import yaml

from proxy.config import yaml_load

__all__ = ["APART_OVER", "read_document_apart"]

APART_OVER = 1 << 20  # bytes: about 15,000 keys
_KEYS_A_LINE = 1000
_TIMEOUT = 600.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# Scalars YAML reads as a float JSON cannot carry: ``.inf``, ``.nan`` (the whole scalar),
# and an exponent large enough to overflow.
_NOT_FINITE = re.compile(
    r"(?:^|[\s\[{,:])[-+]?\.(?:inf|nan)[ \t]*(?:$|[,\]}#])|\.[0-9_]*[eE][-+][0-9]{3}",
    re.IGNORECASE | re.MULTILINE,
)


def read_document_apart(path: str) -> Any:
    """The document of ``path`` (as ``config.read_document``, its ``ConfigError`` too),
    parsed apart if large."""
    from proxy.config.settings import ConfigError, read_document  # not in the child: pydantic

    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    if size <= APART_OVER:
        return read_document(path)
    env = {**os.environ, "PYTHONPATH": _PACKAGE_ROOT}
    child = subprocess.run(
        [sys.executable, "-c", "from proxy.config.read import _child; _child()", path],
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
    _write(sys.stdout.buffer, sys.argv[1])


def _write(out: IO[bytes], path: str) -> None:
    in_place = orjson.dumps({"in_place": True}) + b"\n"
    try:
        text = Path(path).read_text(encoding="utf-8")  # as config.read_document reads it
        if _NOT_FINITE.search(text):
            out.write(in_place)
            return
        document = yaml_load.load(text)
    except (OSError, ValueError, yaml.YAMLError):  # worded as the in-place read words it
        from proxy.config.settings import ConfigError, read_document

        try:
            read_document(path)
        except ConfigError as exc:
            out.write(orjson.dumps({"problems": exc.problems}) + b"\n")
            return
        out.write(in_place)
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
        out.write(in_place)
        return
    out.write(b"\n".join(lines) + b"\n")


def _dumps(value: Any) -> bytes:
    """JSON of exactly what YAML gave: a date or a non-string key is refused, not turned
    into a string (then the parent reads the file itself)."""
    return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_DATETIME)
