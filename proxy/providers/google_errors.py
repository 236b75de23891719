"""What Google's error answers say (pure): ``{"error": {"code", "message", "status",
"details": [...]}}``, a 429's ``RESOURCE_EXHAUSTED`` possibly with a
``type.googleapis.com/google.rpc.RetryInfo`` detail whose ``retryDelay`` is a protobuf
Duration in JSON (``"30s"``, ``"1.5s"``).

Nothing the upstream sends is trusted: the body is bounded by its reader, the delay
parsed strictly (digits, at most 9 decimals, an ``s``), and how long it may hold a
deployment is bounded where it is used (``health.bounded_hold``).
"""

from __future__ import annotations

import re

import orjson

__all__ = ["MAX_RETRY_DELAY", "RETRY_INFO", "google_status", "retry_delay"]

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
# The longest retryDelay believed (an upstream's hold is bounded again by
# server.max_upstream_hold): a day; more, or anything not Google's duration, is ignored.
MAX_RETRY_DELAY = 86_400.0
# A protobuf Duration's JSON form, within any sane bound (at most 10 digits of seconds).
_DURATION = re.compile(r"([0-9]{1,10})(?:\.([0-9]{1,9}))?s")


def _error(body: bytes) -> dict[str, object] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, list) and len(parsed) == 1:  # streamGenerateContent's array
        parsed = parsed[0]
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error if isinstance(error, dict) else None


def google_status(body: bytes) -> str | None:
    """The ``status`` of a Google error body (``RESOURCE_EXHAUSTED``, ``NOT_FOUND``);
    None: not one."""
    error = _error(body)
    status = None if error is None else error.get("status")
    return status if isinstance(status, str) else None


def retry_delay(body: bytes) -> float | None:
    """Seconds a Google error body's ``RetryInfo`` asks to wait; None: none said, or
    not readable."""
    error = _error(body)
    details = None if error is None else error.get("details")
    if not isinstance(details, list):
        return None
    for detail in details:
        if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
            delay = detail.get("retryDelay")
            match = _DURATION.fullmatch(delay) if isinstance(delay, str) else None
            if match is None:
                return None
            seconds = int(match.group(1)) + float(f"0.{match.group(2) or 0}")
            return seconds if seconds <= MAX_RETRY_DELAY else None
    return None
