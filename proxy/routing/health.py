"""Deployment health (pure): failure windows, cooldowns, half-open probes, and the
effective-rate factor learned from upstream 429s. Times are injected seconds.

A deployment is *healthy*, *cooling* (``now < cool_until``: takes nothing), or *probing*
(its cooldown is over but it has not yet proven itself: exactly one request, the probe,
may go; until ``probe_until`` nobody else is sent). A success while probing makes it
healthy; a failure while cooling or probing cools it again (a cooldown is extended, never
shortened).

* Timeouts, connection errors and 5xx count in a sliding ``window``; ``allowed_fails``
  of them cool the deployment for ``time``.
* An upstream 429 cools it at once until the upstream's retry-after / reset (else
  ``time``), and multiplies the deployment's effective rate by ``DECREASE``; the factor
  recovers additively by ``RECOVERY_PER_SECOND`` back to 1 (AIMD), so a limit configured
  too high converges to what the upstream really allows.
* 401/403 (a bad upstream key) cool it for ``time`` with reason ``auth``.

``lua/health.lua`` mirrors this module for the Redis backend. Change both together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "DECREASE",
    "HEALTHY",
    "MIN_FACTOR",
    "RECOVERY_PER_SECOND",
    "CooldownRule",
    "Health",
    "on_failure",
    "on_success",
    "rate_factor",
    "start_probe",
    "wait_for",
]

DECREASE = 0.8  # effective rate x0.8 per upstream 429
MIN_FACTOR = 0.05  # never below 5% of the configured rate
RECOVERY_PER_SECOND = 0.002  # +0.2% of the configured rate per second (~8 min from 0.05)


@dataclass(frozen=True, slots=True)
class CooldownRule:
    allowed_fails: int
    window: float
    time: float


@dataclass(frozen=True, slots=True)
class Health:
    failures: tuple[float, ...] = ()  # times of counted failures, oldest first
    cool_until: float = 0.0
    cooling: bool = False  # cooled and not yet proven healthy by a probe
    probe_until: float = 0.0  # a probe is out until then
    factor: float = 1.0  # effective share of the configured rate
    factor_at: float = 0.0  # when ``factor`` was last set


HEALTHY = Health()


def rate_factor(h: Health, now: float) -> float:
    """The effective-rate factor now, after additive recovery since it was last set."""
    if h.factor >= 1.0:
        return 1.0
    return min(1.0, h.factor + RECOVERY_PER_SECOND * max(0.0, now - h.factor_at))


def wait_for(h: Health, now: float) -> float | None:
    """Seconds until the deployment may take a request: 0 = now; None = a probe is out
    and its outcome decides (the earliest that can be known is ``probe_until``)."""
    if not h.cooling:
        return 0.0
    if now < h.cool_until:
        return h.cool_until - now
    if now < h.probe_until:
        return None
    return 0.0


def start_probe(h: Health, now: float, probe_timeout: float) -> Health:
    """The request just reserved on a deployment whose cooldown ended is its probe."""
    if not h.cooling or now < h.cool_until:
        return h
    return replace(h, probe_until=now + probe_timeout)


def on_success(h: Health, now: float) -> Health:
    """A successful answer: a probing deployment is healthy again."""
    if h.cooling and now >= h.cool_until:
        return replace(h, cooling=False, cool_until=0.0, probe_until=0.0, failures=())
    return h


def on_failure(
    h: Health,
    rule: CooldownRule,
    now: float,
    *,
    cool_for: float | None = None,
    rate_limited: bool = False,
) -> tuple[Health, bool]:
    """Record a failure; returns the new health and whether it started or extended a
    cooldown. ``cool_for`` cools at once for that long (429 with retry-after, auth)."""
    factor = h.factor
    factor_at = h.factor_at
    # One decrease per cooldown: the many requests in flight when the upstream starts
    # answering 429 are one signal, not many.
    if rate_limited and not (h.cooling and now < h.cool_until):
        factor = max(MIN_FACTOR, rate_factor(h, now) * DECREASE)
        factor_at = now
    if cool_for is not None or h.cooling:
        until = now + (cool_for if cool_for is not None else rule.time)
        cooled = Health(
            failures=(),
            cool_until=max(h.cool_until, until),
            cooling=True,
            probe_until=0.0,
            factor=factor,
            factor_at=factor_at,
        )
        return cooled, True
    recent = (*(t for t in h.failures if t > now - rule.window), now)
    if len(recent) >= rule.allowed_fails:
        return Health((), now + rule.time, True, 0.0, factor, factor_at), True
    return Health(recent, h.cool_until, False, 0.0, factor, factor_at), False
