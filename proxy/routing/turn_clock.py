"""Where a reserved turn falls on this process's clock (pure: times are passed in).

The limiter grants a turn at ``sent.at`` on its own clock (Redis's ``TIME``, one per
cluster slot) and says ``wait``: the turn is ``wait`` seconds after the moment it decided.
Sleeping ``wait`` from when the reply is *handled* sends late by however long the reply
took to be handled: a busy event loop, a slow Redis. That delay then adds to any delay of
the wake-up itself, and late turns are what an upstream's short window rejects
(docs/limiter.md, "Late turns").

So each reply also measures the two clocks: ``handled - limiter's now`` is the offset
between them plus that reply's delay, never less than the true offset. The smallest seen
(allowed to rise by ``DRIFT`` a second, so that it follows clocks drifting apart) stands
for the true offset; a turn is then due at ``sent.at + offset`` on this clock, up to the
reply's excess delay sooner than ``handled + wait``. Never sooner by more than
``max_correction``: a limiter clock that steps back (a failover to another Redis) cannot
make turns earlier than that.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DRIFT", "TurnClock"]

DRIFT = 0.001  # seconds a second the smallest offset may rise by (1000 ppm: any sane clock)


@dataclass(slots=True)
class _Offset:
    value: float  # this clock minus the limiter's, plus the quickest reply seen
    seen: float  # when it was last updated (this clock)


class TurnClock:
    """Offsets per limiter clock (a cluster's slots, the local fallback, leases each
    keep their own time): ``sleep`` says how long to sleep until a granted turn."""

    def __init__(self, max_correction: float) -> None:
        self.max_correction = max_correction
        self._offsets: dict[object, _Offset] = {}

    def sleep(self, clock: object, at: float, wait: float, handled: float) -> float:
        """Seconds from ``handled`` (this clock, when the reply was handled) until the
        turn ``at`` (the limiter's ``clock``) that was ``wait`` seconds ahead when the
        limiter decided."""
        due = self.moment(clock, at, wait, handled) - handled
        return max(due, wait - self.max_correction, 0.0)

    def moment(self, clock: object, at: float, wait: float, handled: float) -> float:
        """The turn ``at`` (the limiter's ``clock``, ``wait`` ahead when decided) on this
        clock, as the quickest reply seen places it: when it is due, and what a request
        sent for it is late from (it may already be past when handled)."""
        sample = handled - (at - wait)
        offset = self._offsets.get(clock)
        if offset is None:
            offset = self._offsets[clock] = _Offset(sample, handled)
        else:
            offset.value = min(sample, offset.value + DRIFT * max(handled - offset.seen, 0.0))
            offset.seen = handled
        return at + offset.value
