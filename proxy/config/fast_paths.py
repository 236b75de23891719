"""The proxy's fast paths, each behind a switch. *pure*

A fast path is code that does what a general piece already does, only cheaper. Each one
can be turned off by naming it in ``LLM_PROXY_WITHOUT`` (comma-separated, or ``all``), so
that it is measured against the same code without it (``python -m loadtest.bench
--without NAME``: docs/performance.md) and so that an operator can fall back to the
general piece if one misbehaves, without a new release.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["ENV", "FAST_PATHS", "disabled", "enabled"]

ENV = "LLM_PROXY_WITHOUT"

# Name -> what it replaces, and with what.
FAST_PATHS: dict[str, str] = {
    "protocol": "forwarding POSTs served by the proxy's own HTTP/1.1 cycle (api/direct.py)"
    " instead of uvicorn's ASGI cycle",
    "lean": "the hand-written upstream client (upstream/lean.py) for upstreams without an"
    " egress proxy, instead of aiohttp",
    "leases": "a share of a key's or a deployment's budget held by a replica"
    " (limiter/redis/leases.py) instead of one Redis call per request",
}


def disabled(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The fast paths ``LLM_PROXY_WITHOUT`` turns off; a name it does not know is a
    ``ValueError`` naming the variable and the names it takes."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    names = {part.strip().lower() for part in raw.split(",") if part.strip()}
    if "all" in names:
        return frozenset(FAST_PATHS)
    unknown = sorted(names - FAST_PATHS.keys())
    if unknown:
        raise ValueError(
            f"{ENV}: unknown fast path {', '.join(map(repr, unknown))};"
            f" it takes {', '.join(FAST_PATHS)} or all"
        )
    return frozenset(names)


def enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the fast path ``name`` is on (every one is, unless turned off)."""
    if name not in FAST_PATHS:
        raise KeyError(name)
    return name not in disabled(environ)
