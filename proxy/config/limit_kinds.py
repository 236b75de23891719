"""Limit kinds beyond the built-in ones, each one value in this registry (pure).

The built-in kinds (requests, tokens, input and output tokens: proxy/costs.py) are priced
by the API shapes and settled to the answer's usage. Any other kind is a ``LimitKind``:
its name, what one request costs in it when it is admitted (``price``, from what the
request says: its API, body and stream flag), and what it settles to (``held``: given
back whole when the request ends, a count of requests *in flight*; else kept as charged,
a count of requests *made*). One registration makes it a limit:

    register(LimitKind("streams", lambda r: 1.0 if r.stream else 0.0, held=True))

in a module of ``proxy/kinds/`` (each is imported with this one), and ``{streams: 2,
per: 1d}`` is then a window a key or a team may carry (config.py reads the registry; its
window is ``streams_1d``, its 429 ``key_streams_1d`` or ``team_streams_1d``). The
limiter's backends, Lua scripts, leases and policy charge a window ``cost.get(kind, 0)``
and need nothing more. A held kind limits keys and teams only (a deployment's charge is
kept until its window refills: config refuses it there), and its window still refills
at ``amount`` per ``per``: a slot a lost settlement never gave back (a replica killed
mid-stream) returns within ``per / amount``, which is also the ``retry-after`` of its
429 (the latest a slot frees, not when a request ends).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from proxy.costs import Cost
from proxy.values import value

__all__ = ["KINDS", "LimitKind", "Priced", "held", "price", "register", "registered", "settled"]


@value
class Priced:
    """What a kind may read of a request when it is admitted."""

    api: str  # its API shape's name
    body: Mapping[str, Any]  # its parsed body (read only)
    stream: bool


@value
class LimitKind:
    """A limit kind: ``name`` (a config field, a window's kind), what one request costs
    in it (``price``), and whether that charge is held only while it runs."""

    name: str
    price: Callable[[Priced], float]
    held: bool = False


KINDS: dict[str, LimitKind] = {}


def register(kind: LimitKind) -> None:
    """Make ``kind`` a limit kind (at import of the module that defines it)."""
    if kind.name in KINDS:
        raise ValueError(f"the limit kind '{kind.name}' is registered already")
    KINDS[kind.name] = kind


@contextmanager
def registered(kind: LimitKind) -> Iterator[LimitKind]:
    """``kind`` registered for the block only (tests add a kind of their own)."""
    register(kind)
    try:
        yield kind
    finally:
        del KINDS[kind.name]


def held(name: str) -> bool:
    """Whether ``name`` is a registered kind held only while its request runs."""
    kind = KINDS.get(name)
    return kind is not None and kind.held


def price(cost: Cost, request: Priced) -> Cost:
    """``cost`` (the shape's estimate) with what ``request`` costs in each registered
    kind (kinds it costs nothing in left out); ``cost`` itself when none is registered."""
    if not KINDS:
        return cost
    extra = {name: amount for name, kind in KINDS.items() if (amount := kind.price(request))}
    return {**cost, **extra} if extra else cost


def settled(estimate: Cost, used: Cost | None) -> Cost | None:
    """What a request charged ``estimate`` that used ``used`` (its token kinds: None,
    unknown, everything goes back) settles to in the registered kinds: a kind kept as
    charged, a held one given back (absent: nothing used)."""
    if used is None or not KINDS:
        return used
    kept = {n: a for n, a in estimate.items() if n in KINDS and not KINDS[n].held}
    return {**used, **kept} if kept else used


def _load_kinds() -> None:
    """Every module of ``proxy/kinds/``, each registering its kind."""
    from proxy.config import kinds

    for module in pkgutil.iter_modules(kinds.__path__):
        importlib.import_module(f"proxy.config.kinds.{module.name}")


_load_kinds()
