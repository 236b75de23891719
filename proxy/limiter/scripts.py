"""The Lua scripts, read from package files (``proxy/limiter/lua/*.lua``).

Each operation is one script; the bucket scripts are prefixed with ``bucket.lua``, the
shared math, so every script is self-contained for EVALSHA. No redis import here: tests
run the same sources through any client.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

LIBRARY = "bucket"
BUCKET_SCRIPTS = ("acquire_key", "release_key", "reserve_deployment", "correct_deployment")
PLAIN_SCRIPTS = ("heartbeat",)


@cache
def source(name: str) -> str:
    """The full text of the script ``name`` (without ``.lua``)."""
    if name not in BUCKET_SCRIPTS + PLAIN_SCRIPTS:
        raise ValueError(f"no such limiter script: {name!r}")
    body = _read(name)
    return f"{_read(LIBRARY)}\n{body}" if name in BUCKET_SCRIPTS else body


def _read(name: str) -> str:
    return resources.files("proxy.limiter").joinpath("lua", f"{name}.lua").read_text("utf-8")
