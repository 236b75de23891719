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
* A probe abandoned without an answer (the client went away) frees the probe slot at
  once, so the next request probes instead of everyone waiting for ``probe_until``.

Storage forgets a state at ``expires_at``: from then on it reads as ``HEALTHY``. For a
state that is not cooling this changes nothing (its failures have left the window and its
factor has recovered); a cooling state is forgotten ``FORGET_AFTER`` seconds after its
cooldown (or probe) ended, so a deployment nobody asked for in that long is tried again
as healthy (a broken one cools again after ``allowed_fails``).

``limiter/lua/health.lua`` mirrors this module for the Redis backend, line by line, so
its floats are identical. Change both together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from proxy.limiter.base import CooldownRule, HealthChange, Outcome

__all__ = [
    "DECREASE",
    "FORGET_AFTER",
    "HEALTHY",
    "MIN_FACTOR",
    "RECOVERY_PER_SECOND",
    "CooldownRule",
    "Health",
    "abandon_probe",
    "expires_at",
    "on_failure",
    "on_success",
    "probe_eligible",
    "rate_factor",
    "settle",
    "start_probe",
    "unusable_for",
    "wait_for",
]

DECREASE = 0.8  # effective rate x0.8 per upstream 429
MIN_FACTOR = 0.05  # never below 5% of the configured rate
RECOVERY_PER_SECOND = 0.002  # +0.2% of the configured rate per second (~8 min from 0.05)
FORGET_AFTER = 3600.0  # a cooled deployment idle this long after its cooldown: healthy
FORGET_SLACK = 1.0  # seconds past the moment a state becomes equivalent to HEALTHY


@dataclass(frozen=True, slots=True)
class Health:
    failures: tuple[float, ...] = ()  # times of counted failures, oldest first
    cool_until: float = 0.0
    cooling: bool = False  # cooled and not yet proven healthy by a probe
    probe_until: float = 0.0  # a probe is out until then
    factor: float = 1.0  # effective share of the configured rate
    factor_at: float = 0.0  # when ``factor`` was last set
    probe_lease: str = ""  # the lease id of the probe that is out ("" unknown)


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


def unusable_for(h: Health, now: float) -> float:
    """Seconds until the deployment may take a request (for a probe that is out: until
    its deadline, the latest its outcome can be known)."""
    wait = wait_for(h, now)
    return h.probe_until - now if wait is None else wait


def probe_eligible(h: Health, now: float) -> bool:
    """Cooled, cooldown over, no probe out: the next request reserved is the probe."""
    return h.cooling and wait_for(h, now) == 0.0


def start_probe(h: Health, now: float, probe_timeout: float, lease_id: str = "") -> Health:
    """The request just reserved on a deployment whose cooldown ended is its probe."""
    if not h.cooling or now < h.cool_until:
        return h
    return replace(h, probe_until=now + probe_timeout, probe_lease=lease_id)


def abandon_probe(h: Health, lease_id: str) -> Health:
    """The probe ``lease_id`` ended without an answer: the next request probes."""
    if not h.cooling or not lease_id or lease_id != h.probe_lease:
        return h
    return replace(h, probe_until=0.0, probe_lease="")


def on_success(h: Health, now: float) -> Health:
    """A successful answer: a probing deployment is healthy again."""
    if h.cooling and now >= h.cool_until:
        return replace(
            h, cooling=False, cool_until=0.0, probe_until=0.0, failures=(), probe_lease=""
        )
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


def expires_at(h: Health, window: float) -> float:
    """When storage may forget ``h`` (it then reads as HEALTHY); -inf: it already
    behaves as HEALTHY. ``window`` is the rule's (only failures of a deployment that is
    not cooling need it)."""
    until = -math.inf
    if h.cooling:
        until = max(h.cool_until, h.probe_until) + FORGET_AFTER
    elif h.failures:
        until = h.failures[-1] + window + FORGET_SLACK
    if h.factor < 1.0:
        recovered = h.factor_at + (1.0 - h.factor) / RECOVERY_PER_SECOND + FORGET_SLACK
        until = max(until, recovered)
    return until


def settle(
    h: Health, outcome: Outcome, rule: CooldownRule, now: float, lease_id: str = ""
) -> tuple[Health, HealthChange]:
    """What an upstream answer (or an abandoned request, ``lease_id``) does to ``h``.
    The returned Health is ``h`` itself when nothing changed (nothing to store)."""
    cooled = recovered = False
    if outcome.kind == "success":
        new = on_success(h, now)
        recovered = new is not h
    elif outcome.kind == "failure":
        new, cooled = on_failure(
            h, rule, now, cool_for=outcome.cool_for, rate_limited=outcome.rate_limited
        )
    else:
        new = abandon_probe(h, lease_id)
    cool_for = max(0.0, new.cool_until - now) if new.cooling else 0.0
    return new, HealthChange(cooled=cooled, recovered=recovered, cool_for=cool_for)
