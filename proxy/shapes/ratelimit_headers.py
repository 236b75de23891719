"""OpenAI-style rate-limit headers: written for clients, read from upstreams (pure).

OpenAI formats resets as Go durations (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``).
Numbers read from upstreams are parsed strictly (plain decimals, an exponent at most) and
must be finite: ``inf``, ``nan``, ``1_000`` or ``0x10`` read as unreadable (None).
"""

from __future__ import annotations

import math
import re

__all__ = ["format_reset", "parse_number", "parse_reset"]

# What Python's float() reads beyond these (inf, nan, infinity, 1_000) is no number an
# upstream means.
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def format_reset(seconds: float) -> str:
    """``seconds`` as OpenAI writes it: ``120ms``, ``1.5s``, ``6m0s``, ``1h0m0s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, secs = divmod(seconds, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    tail = f"{int(minutes)}m{round(secs, 3):g}s"
    return f"{hours}h{tail}" if hours else tail


def parse_number(value: str | None) -> float | None:
    """A decimal number (``12``, ``0.5``, ``-1``, ``1e3``), finite; None if unreadable."""
    if value is None:
        return None
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None  # 1e999 overflows to inf


def parse_reset(value: str | None) -> float | None:
    """Seconds from a Go duration (``6m0s``) or a plain number of seconds, finite and not
    negative; None if unreadable."""
    if not value:
        return None
    text = value.strip()
    number = parse_number(text)
    if number is not None:
        return max(number, 0.0)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    return seconds if math.isfinite(seconds) else None
