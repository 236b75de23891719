"""The pacing margin: how late a turn may leave, measured (pure: the clock is passed in).

A turn is a moment on the limiter's clock; the upstream counts when the request arrives.
A turn sent ``d`` late comes ``d`` closer to the turns after it, so every window of a
minute or less is paced as if each of its turns could be up to the *margin* late
(``pacing_headroom``): then no upstream window of a second or more sees one turn too many
(docs/limiter.md, "Late turns").

``routing.pacing_margin: auto`` measures it. Each replica records, for each turn it
sends, how long after the turn was due (on its own clock: ``turn_clock.py``) the request
was handed to the upstream client (``Lateness``): the margin it needs is a high
percentile (``QUANTILE``) of those over a sliding ``PERIOD``, widened at once when the
percentile rises above it, narrowed slowly (halving at most every ``HALF_LIFE``), and
bounded ``MIN_MARGIN``..``MAX_MARGIN``. Replicas share their needs (with Redis: with
their heartbeats) and every one paces with the largest need among the live ones, plus
``RESERVE`` (``Pacing``): a replica that stalls slows the others' turns too, since any
two turns of a deployment, whoever sends them, must stay apart. The margin in force
narrows no faster than the turns already reserved allow (``COMPRESSION``). A turn later
than the margin every replica paces with (``Pacing.agreed``) is not sent (the
dispatcher's check). A fixed ``pacing_margin`` is used as it is.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "COMPRESSION",
    "DEPTH",
    "HALF_LIFE",
    "HEARD_FOR",
    "INITIAL_MARGIN",
    "MAX_MARGIN",
    "MIN_MARGIN",
    "NETWORK_MARGIN",
    "PERIOD",
    "QUANTILE",
    "RESERVE",
    "SHORTEST_UPSTREAM_WINDOW",
    "STEP",
    "Lateness",
    "Pacing",
    "bounded",
    "in_steps",
    "pacing_headroom",
]

MIN_MARGIN = 0.001  # seconds: the margin measured is never less...
MAX_MARGIN = 0.1  # ...nor more (a replica stalled longer meets 429s, waited out)
# Before anything is measured: a replica just started, whose loop may be busy with its
# start-up, paces as the fixed default did; it narrows as its turns show it may.
INITIAL_MARGIN = 0.05
PERIOD = 20.0  # seconds of turns the percentile is over
QUANTILE = 0.99  # of the period's turns, this share leaves within the margin
HALF_LIFE = 5.0  # a margin no longer needed halves at most this often (seconds)
SLOT = 1.0  # the period is kept in slots this long (seconds)...
BIN = 0.0005  # ...each a histogram of lateness in bins this wide (seconds)
BINS = int(MAX_MARGIN / BIN) + 1  # the last one: MAX_MARGIN and beyond
STEP = 0.001  # the margin in force moves in whole steps (limits are rebuilt per step)
# Another replica's need is believed this long after it was last heard (its heartbeats
# come every second; a replica not heard for this long is not alive: policy.py).
HEARD_FOR = 3.0
REFRESH = 0.25  # seconds between recomputing the margin in force (it narrows with time)
# Added to the largest need: what the measure stops short of (the write after it, the
# network, the upstream's own clock, a narrowing's compression below), so that a turn
# within the need is within the margin with room to spare.
RESERVE = 0.002
# A window's turns are kept as a debt in units: when its pace quickens (the margin
# narrows by d), the turns reserved after that come d x depth / (1 s + margin) closer to
# those reserved before, depth being how far ahead turns are reserved (the fair share's
# lookahead, or max_wait without one). So the margin in force narrows by at most this
# many seconds of compression a second...
COMPRESSION = 0.001
DEPTH = 0.5  # ...with turns reserved up to this far ahead (routing.lookahead's default)
MIN_DEPTH = 0.05


# Upstreams enforce per-minute limits over windows of a second or more (OpenAI's are
# "quantized", Azure's 1-10 s): the shortest a margin is stated against.
SHORTEST_UPSTREAM_WINDOW = 1.0
# The margin is never taken as less than this: 1% below the limit (1 s / 99: 10.1 ms of
# a 1 s window), kept for what no replica measures (the network, the upstream's own
# clock). A margin above it covers it: the 1% is not added on top.
NETWORK_MARGIN = SHORTEST_UPSTREAM_WINDOW / 99.0


def pacing_headroom(margin: float) -> float:
    """How far below its limit a window of a minute or less is paced for turns up to
    ``margin`` seconds late: N + 1 turns span the shortest upstream window plus the
    margin, and at least the 1% of ``NETWORK_MARGIN`` (10 ms: 1%; 50 ms: 4.8%)."""
    covered = max(margin, NETWORK_MARGIN)
    return covered / (SHORTEST_UPSTREAM_WINDOW + covered)


def bounded(margin: float) -> float:
    return min(max(margin, MIN_MARGIN), MAX_MARGIN)


def in_steps(margin: float) -> float:
    """``margin`` rounded up to a whole ``STEP`` (never below what it covers)."""
    steps = math.ceil(margin / STEP - 1e-9)
    return steps * STEP


class Lateness:
    """How late this replica's turns leave, over the last ``period`` seconds, and the
    margin that covers them: ``need()``."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        initial: float = INITIAL_MARGIN,
        period: float = PERIOD,
        quantile: float = QUANTILE,
        half_life: float = HALF_LIFE,
    ) -> None:
        self.clock = clock
        self.quantile = quantile
        self.half_life = half_life
        self._slots = max(1, round(period / SLOT))
        # Per slot: its index (whole SLOTs since the clock's zero) and its histogram.
        self._index = [-1] * self._slots
        self._counts = [[0] * BINS for _ in range(self._slots)]
        self.samples = 0  # turns recorded, ever
        self.latest = 0.0  # the latest lateness recorded
        self._margin = bounded(initial)
        self._at = clock()

    def record(self, late: float) -> None:
        """A turn left ``late`` seconds after its moment (an early one counts as on time);
        the margin widens at once if the percentile rose above it (one turn alone, beyond
        the percentile, does not: it is not sent, ``Dispatcher._too_late``)."""
        late = max(late, 0.0)
        now = self.clock()
        index = int(now // SLOT)
        slot = index % self._slots
        counts = self._counts[slot]
        if self._index[slot] != index:  # a slot of an earlier period: emptied
            self._index[slot] = index
            for i in range(BINS):
                counts[i] = 0
        counts[min(int(late / BIN), BINS - 1)] += 1
        self.samples += 1
        self.latest = late
        if late > self._margin:  # the percentile may have risen: widened at once if so
            self._narrowed(now)

    def percentile(self) -> float | None:
        """The ``quantile`` of the period's lateness (a bin's upper edge: never below
        the turns it stands for), None: no turn in the period."""
        now_index = int(self.clock() // SLOT)
        totals = [0] * BINS
        n = 0
        for slot in range(self._slots):
            if now_index - self._index[slot] >= self._slots or self._index[slot] < 0:
                continue
            for i, c in enumerate(self._counts[slot]):
                if c:
                    totals[i] += c
                    n += c
        if n == 0:
            return None
        # The turns beyond the quantile, at most: the fewest the highest bins may hold.
        beyond = math.floor(n * (1.0 - self.quantile))
        seen = 0
        for i in range(BINS - 1, -1, -1):
            seen += totals[i]
            if seen > beyond:
                return (i + 1) * BIN
        return BIN  # (not reached: the bins hold n > beyond)

    def need(self) -> float:
        """The margin this replica's turns need now: at least the period's percentile,
        bounded; above it, what was needed before, halving every ``half_life``."""
        now = self.clock()
        self._narrowed(now)
        return self._margin

    def _narrowed(self, now: float) -> None:
        """The margin, ``now``: what it was, halved for every ``half_life`` since, but
        never below the period's percentile (which widens it when higher)."""
        elapsed = max(now - self._at, 0.0)
        self._at = now
        if self.samples == 0:
            return  # nothing measured yet: nothing says it may narrow
        decayed = self._margin * 0.5 ** (elapsed / self.half_life)
        target = self.percentile()
        self._margin = max(decayed, MIN_MARGIN if target is None else bounded(target))


@dataclass(frozen=True, slots=True)
class InForce:
    """The margin windows are paced with, and whose need set it."""

    margin: float
    replica: str  # the replica whose need it is ("" for a fixed margin)
    auto: bool


class Pacing:
    """The margin in force for this replica's turns: a fixed one, or (``fixed`` None)
    the largest need among the live replicas, this one's (``record``) and those heard
    (``heard``), in whole ``STEP``s. ``version`` changes whenever the margin does: the
    limits paced with it are built again then."""

    def __init__(
        self,
        fixed: float | None,
        replica: str = "",
        clock: Callable[[], float] | None = None,
        lateness: Lateness | None = None,
        depth: float = DEPTH,
    ) -> None:
        self.clock = clock or time.monotonic
        self.fixed = fixed
        self.replica = replica
        self.lateness = lateness or Lateness(self.clock)
        # Seconds of margin a second it may narrow by: turns reserved up to ``depth``
        # ahead are paced anew, closer together (see COMPRESSION).
        self.narrowing = COMPRESSION / max(depth, MIN_DEPTH)
        self._margin = 0.0  # the margin in force, unrounded (narrowing from it)
        self._computed_at = self.clock()
        self._heard: dict[str, tuple[float, float]] = {}  # replica: (need, when heard)
        self.turns_dropped = 0  # turns later than the pacing covered: not sent
        # The margins in force since HEARD_FOR ago, as (until when, margin): the other
        # replicas hear of this one's need with their next heartbeat, and pace with what
        # they heard until then (``agreed``). Just started, nothing of it was heard: they
        # may pace with no margin but the 1% (the 0 until HEARD_FOR from now).
        self._history: deque[tuple[float, float]] = deque([(self._computed_at + HEARD_FOR, 0.0)])
        self.version = 0
        self._in_force = self._compute()
        self._next = self.clock() + REFRESH

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def set_fixed(self, fixed: float | None, depth: float = DEPTH) -> None:
        """A reload's ``pacing_margin`` (None: auto) and how far ahead turns are reserved
        (``depth``); what was measured is kept."""
        self.narrowing = COMPRESSION / max(depth, MIN_DEPTH)
        if fixed != self.fixed:
            self.fixed = fixed
            self._refresh()

    def identify(self, replica: str) -> None:
        """This replica's id (its heartbeats'): its own need is named so."""
        self.replica = replica
        self._refresh()

    def record(self, late: float) -> None:
        """One of this replica's turns left ``late`` seconds after its moment."""
        if self.fixed is not None:
            return
        self.lateness.record(late)
        if late > self._in_force.margin:  # widened at once, here
            self._refresh()

    def dropped(self, late: float) -> None:
        """A turn ``late`` seconds past its moment, later than the pacing covers, was not
        sent (its request asked again): counted, and measured as any turn."""
        self.turns_dropped += 1
        self.record(late)

    def own(self) -> float | None:
        """This replica's need, as it is shared with the others (None: fixed, or no turn
        measured yet: a replica that starts does not widen every other's margin)."""
        if self.fixed is not None or self.lateness.samples == 0:
            return None
        return self.lateness.need()

    def heard(self, needs: Mapping[str, float]) -> None:
        """What the other live replicas need (their own ids: this one's is skipped)."""
        now = self.clock()
        for replica, need in needs.items():
            if replica != self.replica and math.isfinite(need):
                self._heard[replica] = (bounded(need), now)
        self._refresh()

    def in_force(self) -> InForce:
        """The margin in force now (recomputed at most every ``REFRESH``: it narrows
        with time)."""
        if self.clock() >= self._next:
            self._refresh()
        return self._in_force

    def margin(self) -> float:
        return self.in_force().margin

    def view(self) -> dict[str, object]:
        """What ``/admin/state`` shows: the margin in force, whose need set it (``set_by``:
        this replica's id, another live replica's, or ``fixed``), this replica's own need
        and what it measured, and the share of a limit windows of a minute or less are
        paced at."""
        force = self.in_force()
        view: dict[str, object] = {
            "mode": "auto" if force.auto else "fixed",
            "margin_seconds": round(force.margin, 6),
            "set_by": force.replica if force.auto else "fixed",
            "set_here": force.auto and force.replica == self.replica,
            "paced_at": round(1.0 - pacing_headroom(force.margin), 6),
            "late_turns_not_sent": self.turns_dropped,
        }
        if force.auto:
            percentile = self.lateness.percentile()
            view["replica"] = self.replica
            view["need_here_seconds"] = round(self.lateness.need(), 6)
            view["measured"] = {
                "turns": self.lateness.samples,
                "p99_seconds": None if percentile is None else round(percentile, 6),
                "period_seconds": PERIOD,
            }
            view["others"] = {r: round(n, 6) for r, (n, _) in sorted(self._heard.items())}
        return view

    def agreed(self) -> float:
        """The smallest margin in force here over the last ``HEARD_FOR`` seconds: what
        every live replica paces with at least, once this one's need of then has reached
        them with the heartbeats (a need that widened here since may not have yet)."""
        margin = self.in_force().margin
        history = self._history  # (until when, a margin in force before)
        cutoff = self.clock() - HEARD_FOR
        while history and history[0][0] <= cutoff:
            history.popleft()
        return min([margin, *(before for _, before in history)])

    def _refresh(self) -> None:
        now_at = self.clock()
        self._next = now_at + REFRESH
        now = self._compute()
        if now != self._in_force:
            if now.margin != self._in_force.margin:
                self.version += 1
                self._history.append((now_at, self._in_force.margin))
                if len(self._history) > 256:  # bounded: only the last seconds matter
                    self._history.popleft()
            self._in_force = now

    def _compute(self) -> InForce:
        if self.fixed is not None:
            return InForce(self.fixed, "", auto=False)
        now = self.clock()
        for replica in [r for r, (_, at) in self._heard.items() if now - at > HEARD_FOR]:
            del self._heard[replica]
        best, who = self.lateness.need(), self.replica
        for replica, (need, _) in sorted(self._heard.items()):
            if need > best:
                best, who = need, replica
        target = min(bounded(best) + RESERVE, MAX_MARGIN)
        # Narrowed no faster than the turns already reserved allow (``narrowing``).
        elapsed = max(now - self._computed_at, 0.0)
        self._computed_at = now
        self._margin = max(target, self._margin - self.narrowing * elapsed)
        return InForce(in_steps(self._margin), who, auto=True)
