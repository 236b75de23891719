"""Deployment health (pure): failure windows, cooldowns, half-open probes, holds after
upstream 429s, and the request rate learned from them. Times are injected seconds.

A deployment is *healthy*; *cooling* after failures (``now < cool_until``: takes
nothing), then *probing* (its cooldown is over but it has not yet proven itself: exactly
one request, the probe, may go; until ``probe_until`` nobody else is sent); or *held*
after an upstream 429 (``now < hold_until``: the upstream said when it takes requests
again, so requests get turns from then on, and no probe is needed). A success while
probing makes it healthy; a failure while cooling or probing cools it again (a cooldown
or a hold is extended, never shortened).

* Timeouts, connection errors and 5xx count in a sliding ``window``; ``allowed_fails``
  of them cool the deployment for ``time``. 401/403 (a bad upstream key) cool it for
  ``time`` with reason ``auth``.
* What an upstream says of how long to hold off (a 429's retry-after or reset) holds at
  most ``rule.max_hold`` seconds (``bounded_hold``): a NaN says nothing, an infinite or
  absurd one is cut to the bound, so no lie outlives it.
* A probe abandoned without an answer (the client went away) frees the probe slot at
  once, so the next request probes instead of everyone waiting for ``probe_until``.

**Learning from 429s.** Each turn granted is counted in the deployment's current
*period* (``sent`` turns since ``sent_from``, the first one's turn). An upstream 429 on the
n-th turn of its period, sent at ``t``, with a retry-after of ``r``, says: the upstream took
the n-1 before it and takes the next at ``t + r``, so it allows about
``(n - 1) / (t - sent_from + r)`` requests a second (exactly that for a sliding-window
limit that our sends filled). The deployment is held until ``t + r``; the rate in force
drops to ``MARGIN`` of that (never rising on a 429), as a *learned* window of one request
at a time on top of the configured ones; ``epoch`` counts these events, so turns reserved
before one are taken again at the new pace; a new period starts. A 429 while a learned
rate is in force lowers it by ``MARGIN`` at most: its period began with the previous
lesson, when the upstream's window still held the turns sent before, so what it measures
is too low (a 429 a tenth of a second into a period measured a few requests over the
hold). While no 429 comes, the
learned rate grows by ``GROWTH`` of itself per second, and is forgotten once it has
doubled (the configured windows cap it anyway). Only the first 429 of a period teaches:
the requests in flight with it answer for the same overload.

Storage forgets a state at ``expires_at``: from then on it reads as ``HEALTHY``. For a
state that is not cooling this changes nothing (its failures have left the window, its
hold is over, its learned rate has doubled, its period is idle); a cooling state is
forgotten ``FORGET_AFTER`` seconds after its cooldown (or probe) ended, so a deployment
nobody asked for in that long is tried again as healthy (a broken one cools again after
``allowed_fails``).

``limiter/redis/lua/health.lua`` mirrors this module for the Redis backend, line by line, so
its floats are identical. Change both together.
"""

from __future__ import annotations

import math
from dataclasses import replace

from proxy.limiter.base import CooldownRule, HealthChange, Outcome, Rate
from proxy.values import value

__all__ = [
    "DECREASE",
    "FORGET_AFTER",
    "GROWTH",
    "HEALTHY",
    "HOLD_WITHOUT_HINT",
    "LEARNED_SPAN",
    "MARGIN",
    "MIN_RATE",
    "PERIOD_IDLE",
    "CooldownRule",
    "Evidence",
    "Health",
    "abandon_probe",
    "bounded_hold",
    "counted",
    "expires_at",
    "hold_for",
    "learned_rate",
    "learned_window_rate",
    "on_failure",
    "on_rate_limited",
    "on_success",
    "probe_eligible",
    "settle",
    "start_probe",
    "unusable_for",
    "wait_for",
]

MARGIN = 0.95  # pace at 95% of the rate an upstream was seen to admit
GROWTH = 0.002  # the learned rate grows by 0.2% of itself a second without a 429...
LEARNED_SPAN = 2.0  # ...and is forgotten once it has doubled (~8 min)
DECREASE = 0.8  # when a 429 says nothing measurable: 80% of the rate in force
MIN_RATE = 1.0 / 60.0  # never below one request a minute
HOLD_WITHOUT_HINT = 1.0  # seconds a 429 without retry-after or reset holds
PERIOD_IDLE = 60.0  # a period with no turn for this long is over (the upstream forgot it)
FORGET_AFTER = 3600.0  # a cooled deployment idle this long after its cooldown: healthy
FORGET_SLACK = 1.0  # seconds past the moment a state becomes equivalent to HEALTHY


@value
class Health:
    failures: tuple[float, ...] = ()  # times of counted failures, oldest first
    cool_until: float = 0.0
    cooling: bool = False  # cooled and not yet proven healthy by a probe
    probe_until: float = 0.0  # a probe is out until then
    probe_lease: str = ""  # the lease id of the probe that is out ("" unknown)
    hold_until: float = 0.0  # an upstream 429: no turn before then
    learned: float = 0.0  # requests a second learned from 429s (0: none)
    learned_at: float = 0.0  # when ``learned`` was set; it grows from then
    epoch: int = 0  # learning events so far
    sent: int = 0  # turns granted in the current period
    sent_from: float = 0.0  # the period's first turn
    sent_last: float = 0.0  # the period's latest turn


HEALTHY = Health()


def bounded_hold(seconds: float | None, max_hold: float) -> float | None:
    """An upstream's hold as the limiter takes it: never negative, at most ``max_hold``
    (an infinite one too); None (no hint) for none or a NaN."""
    if seconds is None or seconds != seconds:
        return None
    return min(max(seconds, 0.0), max_hold)


def learned_rate(h: Health, now: float) -> float:
    """The learned requests a second now, grown since it was set; 0 when none (never
    learned, or doubled since: forgotten)."""
    if h.learned <= 0.0:
        return 0.0
    growth = 1.0 + GROWTH * max(0.0, now - h.learned_at)
    return 0.0 if growth >= LEARNED_SPAN else h.learned * growth


def learned_window_rate(h: Health, now: float) -> Rate | None:
    """The learned window: one request at a time at the learned rate (None: none)."""
    rate = learned_rate(h, now)
    if rate <= 0.0:
        return None
    return Rate(limit=rate, period=1.0, capacity=1.0)


def wait_for(h: Health, now: float) -> float | None:
    """Seconds until a failed deployment may take a request: 0 = now; None = a probe is
    out and its outcome decides (the earliest that can be known is ``probe_until``).
    Holds are not counted here (see ``hold_for``)."""
    if not h.cooling:
        return 0.0
    if now < h.cool_until:
        return h.cool_until - now
    if now < h.probe_until:
        return None
    return 0.0


def hold_for(h: Health, now: float) -> float:
    """Seconds left of a 429's hold (0: none)."""
    return max(0.0, h.hold_until - now)


def unusable_for(h: Health, now: float) -> float:
    """Seconds until the deployment may take a request (for a probe that is out: until
    its deadline, the latest its outcome can be known)."""
    wait = wait_for(h, now)
    cooling = h.probe_until - now if wait is None else wait
    return max(cooling, hold_for(h, now))


def probe_eligible(h: Health, now: float) -> bool:
    """Cooled, cooldown over, no probe out: the next request reserved is the probe."""
    return h.cooling and wait_for(h, now) == 0.0


def start_probe(h: Health, now: float, probe_timeout: float, lease_id: str = "") -> Health:
    """The request just reserved on a deployment whose cooldown ended is its probe."""
    if not h.cooling or now < h.cool_until:
        return h
    return replace(h, probe_until=now + probe_timeout, probe_lease=lease_id)


def counted(h: Health, turn: float, turns: int = 1) -> Health:
    """``turns`` turns at ``turn`` were granted (a lease's, leases.py, at once): count
    them in the current period (or start one)."""
    # Every reservation runs this: the constructor directly, not dataclasses.replace
    # (which looks the fields up each call, a measurable share of a memory reservation).
    if h.sent == 0 or turn - h.sent_last > PERIOD_IDLE:
        sent, sent_from, sent_last = turns, turn, turn
    else:
        sent, sent_from, sent_last = h.sent + turns, h.sent_from, max(h.sent_last, turn)
    return Health(
        h.failures, h.cool_until, h.cooling, h.probe_until, h.probe_lease, h.hold_until,
        h.learned, h.learned_at, h.epoch, sent, sent_from, sent_last,
    )  # fmt: skip


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


@value
class Evidence:
    """What a 429 says, with what the limiter told the request that got it: its turn's
    ``epoch`` and ``sequence`` in its period, when it was sent (limiter time), the pace
    in force then (requests a second; 0 unknown), and how long the upstream holds."""

    epoch: int = 0
    sequence: int = 0
    sent_at: float = 0.0
    pace: float = 0.0
    hold: float | None = None


def on_rate_limited(h: Health, now: float, evidence: Evidence) -> Health:
    """An upstream 429: hold, and learn from the first of a period (see the module)."""
    hold = evidence.hold if evidence.hold is not None else HOLD_WITHOUT_HINT
    held = replace(h, hold_until=max(h.hold_until, now + hold))
    if evidence.epoch != h.epoch or h.sent == 0:
        return held  # the same overload as a 429 already learned from, or unknown
    learned = learned_rate(h, now)
    in_force = learned or evidence.pace
    admitted = float(min(evidence.sequence, h.sent) - 1)
    span = evidence.sent_at - h.sent_from + hold
    if admitted > 0 and span > 0:
        rate = MARGIN * admitted / span
    elif in_force > 0:
        rate = DECREASE * in_force
    else:
        return held  # nothing measured, nothing in force: nothing to learn
    if learned > 0:
        # A period that began with a lesson: the upstream's window still held the turns
        # sent before it, so what this one measures is too low (wildly, when short). A
        # lesson already paces below what the upstream admitted: this one lowers it by
        # MARGIN at most.
        rate = max(rate, MARGIN * learned)
    if in_force > 0:
        rate = min(rate, in_force)
    return replace(
        held,
        learned=max(MIN_RATE, rate),
        learned_at=now + hold,
        epoch=h.epoch + 1,
        sent=0,
        sent_from=0.0,
        sent_last=0.0,
    )


def on_failure(
    h: Health, rule: CooldownRule, now: float, cool_for: float | None
) -> tuple[Health, bool]:
    """Record a failure that is not a 429; returns the new health and whether it started
    or extended a cooldown. ``cool_for`` cools at once for that long (a bad key)."""
    if cool_for is not None or h.cooling:
        until = now + (cool_for if cool_for is not None else rule.time)
        cooled = replace(
            h,
            failures=(),
            cool_until=max(h.cool_until, until),
            cooling=True,
            probe_until=0.0,
            probe_lease="",
        )
        return cooled, True
    recent = (*(t for t in h.failures if t > now - rule.window), now)
    if len(recent) >= rule.allowed_fails:
        cooled = replace(h, failures=(), cool_until=now + rule.time, cooling=True, probe_until=0.0)
        return cooled, True
    return replace(h, failures=recent, probe_until=0.0), False


def expires_at(h: Health, window: float) -> float:
    """When storage may forget ``h`` (it then reads as HEALTHY); -inf: it already
    behaves as HEALTHY. ``window`` is the rule's (only failures of a deployment that is
    not cooling need it)."""
    until = -math.inf
    if h.cooling:
        until = max(h.cool_until, h.probe_until) + FORGET_AFTER
    elif h.failures:
        until = h.failures[-1] + window + FORGET_SLACK
    if h.hold_until > 0.0:
        until = max(until, h.hold_until + FORGET_SLACK)
    if h.learned > 0.0:
        doubled = h.learned_at + (LEARNED_SPAN - 1.0) / GROWTH + FORGET_SLACK
        until = max(until, doubled)
    if h.sent > 0:
        until = max(until, h.sent_last + PERIOD_IDLE + FORGET_SLACK)
    return until


def settle(
    h: Health,
    outcome: Outcome,
    rule: CooldownRule,
    now: float,
    lease_id: str = "",
    evidence: Evidence | None = None,
) -> tuple[Health, HealthChange]:
    """What an upstream answer (or an abandoned request, ``lease_id``) does to ``h``;
    a 429's ``evidence`` (default: none, which holds without learning). The returned
    Health is ``h`` itself when nothing changed (nothing to store)."""
    cooled = recovered = False
    if outcome.kind == "success":
        new = on_success(h, now)
        recovered = new is not h
    elif outcome.kind == "failure" and outcome.rate_limited:
        base = evidence if evidence is not None else Evidence(epoch=-1)
        hold = bounded_hold(outcome.cool_for, rule.max_hold)
        new = on_rate_limited(h, now, replace(base, hold=hold))
        cooled = True
    elif outcome.kind == "failure":
        new, cooled = on_failure(h, rule, now, outcome.cool_for)
    else:
        new = abandon_probe(h, lease_id)
    return new, HealthChange(cooled, recovered, unusable_for(new, now), new.epoch)
