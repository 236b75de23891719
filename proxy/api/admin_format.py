"""How the admin pages write numbers, amounts and times: one format everywhere (pure).

Whole things (requests, tokens, slots) are whole numbers, a fraction left floored (0.99
of a request is not a request); other figures (a rate in force after pacing) keep at
most two decimals; every number has thousands separators; dollars have a ``$`` and
cents; a time span is ``0.5 s``, ``42 s``, ``2 min``, ``3.5 h`` or ``4 d``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["count", "dollars", "duration", "number", "per", "rate", "unit", "utc"]

# What a window or a budget counts, as words (singular, plural).
_UNITS = {
    "requests": ("request", "requests"),
    "tokens": ("token", "tokens"),
    "input_tokens": ("input token", "input tokens"),
    "output_tokens": ("output token", "output tokens"),
}

# Spans with a word of their own: "per minute", not "per 1 min".
_NAMED = {1.0: "second", 60.0: "minute", 3600.0: "hour", 86400.0: "day", 604800.0: "week"}

# The units of a time span, largest first: (seconds, symbol).
_SPANS = ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))


def count(x: float) -> str:
    """A number of whole things: ``1,234`` (112.9 requests left are 112)."""
    if not math.isfinite(x):
        return "unlimited" if x > 0 else "0"
    return f"{math.floor(x + 1e-9):,}"


def number(x: float) -> str:
    """Any other figure: ``1,234``, ``0.94``, ``1,234.5`` (at most two decimals)."""
    if not math.isfinite(x):
        return "unlimited" if x > 0 else "0"
    text = f"{x:,.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def rate(x: float) -> str:
    """A rate in force (a limit after pacing, a learned rate): ``56.57``, ``94,286``
    (whole from a hundred up: its decimals say nothing there)."""
    return number(x) if abs(x) < 100 else number(round(x))


def dollars(x: float) -> str:
    """``$1,234.56``; under a dollar with up to six decimals (``$0.0042``), as a cheap
    request's cost would vanish in cents."""
    if abs(x) >= 1 or x == 0:
        return f"${x:,.2f}"
    text = f"{x:.6f}".rstrip("0")
    return "$" + (text + "0" * (2 - len(text.partition(".")[2])) if "." in text else text)


def duration(seconds: float) -> str:
    """``0.5 s``, ``42 s``, ``2 min``, ``3.5 h``, ``4 d``: the largest unit the span
    fills, one decimal under ten of it (never less than ``0.1 s``)."""
    seconds = max(seconds, 0.1)
    for size, symbol in _SPANS:
        if seconds >= size or size == 1.0:
            amount = seconds / size
            shown = f"{amount:.1f}".removesuffix(".0") if amount < 10 else f"{amount:,.0f}"
            return f"{shown} {symbol}"
    raise AssertionError("unreachable")  # pragma: no cover


def per(seconds: float) -> str:
    """``per minute``, ``per day``, ``per 10 s``, ``per 30 d``."""
    named = _NAMED.get(float(seconds))
    return f"per {named}" if named else f"per {duration(seconds)}"


def unit(kind: str, amount: float = 2) -> str:
    """``requests``, ``tokens``, ``input tokens``: what a window or budget of ``kind``
    counts (singular for exactly one)."""
    one, many = _UNITS.get(kind, (kind, kind))
    return one if amount == 1 else many


def utc(moment: Mapping[str, Any], seconds: bool = False) -> str:
    """A moment of the state (``{"in", "at"}``) as a date and time: ``2025-06-01 00:00
    UTC`` (``seconds``: ``00:00:00``)."""
    at = str(moment["at"])
    return f"{at[:10]} {at[11:19] if seconds else at[11:16]} UTC"
