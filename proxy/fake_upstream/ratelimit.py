"""A strict sliding-window log of accepted requests (pure: the caller passes the time).

Real providers are stricter than a token bucket at the edges, so the fake upstream counts
exactly: a request is accepted only if, counting it, the accepted requests (and their
tokens) within the last `window` seconds stay within the limits. Rejected requests leave
no trace. The log is kept even without limits, to measure `peak_window_requests`.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

# Compact the log's lists only once this many expired entries pile up, so pruning stays
# amortised O(1) instead of shifting the lists on every request.
_COMPACT_AFTER = 1024


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request does not fit: which limit, and when it would fit."""

    kind: str  # "requests", "tokens" (OpenAI's error `type`), "input_tokens", "output_tokens"
    limit: int
    used: int
    requested: int
    retry_after: float  # seconds until the request would be accepted
    too_large: bool = False  # the request alone exceeds the token limit


@dataclass(frozen=True, slots=True)
class WindowState:
    """The window's occupancy, for the x-ratelimit-* headers."""

    requests: int
    tokens: int
    requests_reset: float  # seconds until no accepted request is left in the window
    tokens_reset: float


class SlidingWindowLog:
    """Timestamps and cumulative token costs of the accepted requests, oldest first."""

    __slots__ = ("_cum", "_cum_before_head", "_head", "_times", "peak", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._times: list[float] = []
        self._cum: list[int] = []  # running token total including each entry
        self._head = 0  # index of the oldest entry still inside the window
        self._cum_before_head = 0
        self.peak = 0  # largest number of accepted requests seen within one window

    def clear(self) -> None:
        self._times.clear()
        self._cum.clear()
        self._head = 0
        self._cum_before_head = 0
        self.peak = 0

    def state(self, now: float) -> WindowState:
        self._prune(now)
        count = len(self._times) - self._head
        reset = self._times[-1] + self.window - now if count else 0.0
        return WindowState(count, self._tokens(), reset, reset)

    def check(
        self, now: float, cost: int, rpm: int | None, tpm: int | None, kind: str = "tokens"
    ) -> Rejection | None:
        """Whether a request of `cost` tokens fits now; records nothing. `kind` names the
        token limit in a rejection (one log per token kind: tokens, input, output)."""
        self._prune(now)
        count = len(self._times) - self._head
        if rpm is not None and count + 1 > rpm:
            # The (count - rpm + 1) oldest entries must expire first.
            expires = self._times[self._head + count - rpm] + self.window
            return Rejection("requests", rpm, count, 1, expires - now)
        if tpm is not None:
            return self._check_tokens(now, cost, tpm, kind)
        return None

    def add(self, now: float, cost: int) -> int:
        """Record an accepted request; returns the number of requests in the window."""
        self._prune(now)
        total = self._cum[-1] if self._cum else self._cum_before_head
        self._times.append(now)
        self._cum.append(total + cost)
        count = len(self._times) - self._head
        if count > self.peak:
            self.peak = count
        return count

    def _check_tokens(self, now: float, cost: int, tpm: int, kind: str) -> Rejection | None:
        used = self._tokens()
        if used + cost <= tpm:
            return None
        if cost > tpm:
            wait = self._times[-1] + self.window - now if used else self.window
            return Rejection(kind, tpm, used, cost, wait, too_large=True)
        # Expire the oldest entries until the remaining tokens plus `cost` fit.
        needed = self._cum[-1] + cost - tpm
        index = bisect_left(self._cum, needed, self._head)
        return Rejection(kind, tpm, used, cost, self._times[index] + self.window - now)

    def _tokens(self) -> int:
        if len(self._times) == self._head:
            return 0
        return self._cum[-1] - self._cum_before_head

    def _prune(self, now: float) -> None:
        times = self._times
        if self._head == len(times) or times[self._head] > now - self.window:
            return  # fast path: nothing expired
        head = bisect_right(times, now - self.window, self._head)
        self._cum_before_head = self._cum[head - 1]
        self._head = head
        if head >= _COMPACT_AFTER and head * 2 >= len(times):
            del times[:head]
            del self._cum[:head]
            self._head = 0


def format_duration(seconds: float) -> str:
    """Seconds in OpenAI's header format (Go's Duration): `120ms`, `1.5s`, `6m0s`, `1h2m3s`.

    Rounded up to the millisecond, so a client never waits too little.
    """
    millis = ceil_millis(seconds)
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ceil_seconds(seconds: float) -> int:
    """`retry-after` value: whole seconds, rounded up, at least 1 for a positive wait."""
    return max(1, math.ceil(seconds - 1e-9)) if seconds > 0 else 0


def ceil_millis(seconds: float) -> int:
    """`retry-after-ms` value: whole milliseconds, rounded up."""
    return max(0, math.ceil(seconds * 1000 - 1e-9))
