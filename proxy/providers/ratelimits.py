"""What an upstream's answer says about its budget (pure).

Reads OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets as Go
durations such as ``6m0s``), Azure OpenAI's part of them (only ``x-ratelimit-remaining-*``
on its answers, ``-1`` for "unknown" on some APIs; on a 429, ``retry-after-ms`` and
``retry-after``, or instead a ``x-rate-limit-reset-tokens`` of seconds), Anthropic's
``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``
(resets as RFC 3339 times), and ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP
date).

Every number is read strictly and finite (``ratelimit_headers.parse_number``); anything
else is as if not sent. How long a time may hold a deployment is bounded where it is
used (``health.bounded_hold``, ``server.max_upstream_hold``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, replace
from datetime import datetime
from email.utils import parsedate_to_datetime

from proxy.limiter.base import Remaining
from proxy.limiter.core.health import bounded_hold
from proxy.shapes.ratelimit_headers import parse_number, parse_reset
from proxy.values import value

# Tell the limiter what the upstream has left only when it is getting low: most answers
# then cost no extra storage call.
SYNC_BELOW = 0.1

__all__ = [
    "SYNC_BELOW",
    "UpstreamBudget",
    "anthropic_budget",
    "parse_budget",
    "remaining_report",
    "retry_after",
]

# RFC 3339 as Anthropic writes its resets: a date, a time, a zone (Z or an offset).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)


@value
class UpstreamBudget:
    limit_requests: float | None = None
    remaining_requests: float | None = None
    reset_requests: float | None = None  # seconds from now
    limit_tokens: float | None = None
    remaining_tokens: float | None = None
    reset_tokens: float | None = None
    # Anthropic's separate input and output token limits.
    limit_input_tokens: float | None = None
    remaining_input_tokens: float | None = None
    reset_input_tokens: float | None = None
    limit_output_tokens: float | None = None
    remaining_output_tokens: float | None = None
    reset_output_tokens: float | None = None
    _: KW_ONLY
    # The answer says the upstream throttled it whatever its status (Bedrock's 503
    # ServiceUnavailableException): learned as a 429 is (upstream/outcomes).
    throttled: bool = False

    @property
    def empty(self) -> bool:
        return (
            self.remaining_requests is None
            and self.remaining_tokens is None
            and self.remaining_input_tokens is None
            and self.remaining_output_tokens is None
        )

    @property
    def resets(self) -> list[float]:
        """Every reset it announced, in seconds from now."""
        found = (
            self.reset_requests,
            self.reset_tokens,
            self.reset_input_tokens,
            self.reset_output_tokens,
        )
        return [r for r in found if r is not None]

    def assuming(self, requests: float | None, tokens: float | None) -> UpstreamBudget:
        """With the per-minute limits ``requests`` and ``tokens`` (the configured ones)
        where the upstream did not announce its own (Azure announces none): what is left
        can then be judged low before it is gone."""
        return replace(
            self,
            limit_requests=self.limit_requests or requests,
            limit_tokens=self.limit_tokens or tokens,
        )


def _count(value: str | None) -> float | None:
    """A limit or what is left of it; negative (Azure's -1): not known."""
    number = parse_number(value)
    return number if number is not None and number >= 0 else None


def _until(value: str | None, now: float) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time (Anthropic's resets), not negative;
    None for anything else (``fromisoformat`` alone takes far more forms)."""
    if value is None or not _RFC3339.fullmatch(value.strip()):
        return None
    text = value.strip().upper().replace("Z", "+00:00")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:  # a month 13, a second 61
        return None
    return max(moment.timestamp() - now, 0.0)


def parse_budget(headers: Mapping[str, str], now: float) -> UpstreamBudget:
    """The upstream's view of its budget; ``now`` is the wall clock (epoch seconds)."""
    get = headers.get
    # Azure has answered 429s with this spelling (seconds) instead of retry-after.
    reset_tokens = get("x-ratelimit-reset-tokens") or get("x-rate-limit-reset-tokens")
    if (
        get("x-ratelimit-remaining-requests") is not None
        or get("x-ratelimit-remaining-tokens") is not None
        or reset_tokens is not None
    ):
        return UpstreamBudget(
            limit_requests=_count(get("x-ratelimit-limit-requests")),
            remaining_requests=_count(get("x-ratelimit-remaining-requests")),
            reset_requests=parse_reset(get("x-ratelimit-reset-requests")),
            limit_tokens=_count(get("x-ratelimit-limit-tokens")),
            remaining_tokens=_count(get("x-ratelimit-remaining-tokens")),
            reset_tokens=parse_reset(reset_tokens),
        )
    return anthropic_budget(headers, now)


# Anthropic's headers per kind, in ``UpstreamBudget``'s order: (limit, remaining, reset).
_ANTHROPIC_KINDS = tuple(
    tuple(f"anthropic-ratelimit-{kind}-{part}" for part in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
)
_ANTHROPIC_NAMES = frozenset(name for names in _ANTHROPIC_KINDS for name in names)
_NONE = UpstreamBudget()  # an answer that says nothing of its budget (the usual one)


def anthropic_budget(headers: Mapping[str, str], now: float) -> UpstreamBudget:
    """Anthropic's ``anthropic-ratelimit-*`` headers: requests, input and output tokens
    apart, and ``tokens`` (the most restrictive of those two now)."""
    if _ANTHROPIC_NAMES.isdisjoint(headers):  # one C-level scan for the usual answer
        return _NONE
    get = headers.get
    found: list[float | None] = []
    for limit, remaining, reset in _ANTHROPIC_KINDS:
        found += (_count(get(limit)), _count(get(remaining)), _until(get(reset), now))
    return UpstreamBudget(*found)


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the upstream asks us to wait, from the most precise header it sent."""
    ms = parse_number(headers.get("retry-after-ms"))
    if ms is not None and ms >= 0:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = parse_number(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - now, 0.0)


def remaining_report(budget: UpstreamBudget, max_hold: float) -> Remaining | None:
    """What the limiter should hear of the upstream's remaining budget: nothing while
    plenty is left, else what is left and, with no request left, when the next frees
    (at most ``max_hold`` seconds away)."""
    if not (
        _low(budget.remaining_requests, budget.limit_requests)
        or _low(budget.remaining_tokens, budget.limit_tokens)
        or _low(budget.remaining_input_tokens, budget.limit_input_tokens)
        or _low(budget.remaining_output_tokens, budget.limit_output_tokens)
    ):
        return None
    return Remaining(
        requests=budget.remaining_requests,
        requests_wait=bounded_hold(
            _next_unit(budget.reset_requests, budget.limit_requests, budget.remaining_requests),
            max_hold,
        ),
        tokens=budget.remaining_tokens,
        input_tokens=budget.remaining_input_tokens,
        output_tokens=budget.remaining_output_tokens,
    )


def _next_unit(reset: float | None, limit: float | None, remaining: float | None) -> float | None:
    """When the next request frees up. Upstreams announce when their budget is *full*
    again (OpenAI: "resets to its initial state"); it refills gradually before that, one
    request about every ``reset / used``."""
    if reset is None or limit is None or remaining is None:
        return reset
    return reset / max(limit - remaining, 1.0)


def _low(remaining: float | None, limit: float | None) -> bool:
    if remaining is None:
        return False
    return remaining <= 0 or (limit is not None and remaining < SYNC_BELOW * limit)
