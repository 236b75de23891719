"""Deferred requests of one client key wait in one local line per (model group, key).

The limiter defers a request when the fair share owes the next turns to other keys
(limiter/core/fairness.py) and says when to ask again. Left alone, every deferred request of a
key would ask at that same moment: round trips would grow with the waiters. Instead the
deferred requests of a key form a line in this process: only its *head* asks the limiter
(when the limiter said), the others wait behind it in arrival order, and each asks once
it reaches the head (at once when the one before got a turn: the next may fit too). A
request arriving while its key's line is not empty joins it without asking.

Asyncio only (no I/O): the dispatcher races a ticket against the client leaving and the
request's own ``max_wait``. A waiter that cannot be covered by its ``max_wait`` (it would
still be waiting when the head next asks) is told at once, with when to retry.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.costs import Cost
from proxy.limiter.base import DeploymentLimits
from proxy.limiter.core.fairness import depth

__all__ = ["Line", "Lines", "Ticket", "turn_spacing"]

# A ticket resolves to None (this request heads its line now: ask the limiter) or to the
# moment (monotonic) before which nobody behind the head can be served (refused).
Ticket = asyncio.Future[float | None]


@dataclass(slots=True)
class _Waiter:
    ticket: Ticket
    deadline: float  # when its max_wait runs out (monotonic)


class Line:
    """One key's deferred requests for one model group, in this process."""

    __slots__ = ("_lines", "_name", "_waiters", "headed", "not_before")

    def __init__(self, lines: dict[tuple[str, str], Line], name: tuple[str, str]) -> None:
        self._lines = lines
        self._name = name
        self._waiters: deque[_Waiter] = deque()
        self.headed = False  # a request heads the line (it asks the limiter)
        self.not_before = 0.0  # when the head asks next (monotonic), as the limiter said

    @property
    def busy(self) -> bool:
        return self.headed or bool(self._waiters)

    def join(self, deadline: float, now: float) -> Ticket:
        """A ticket for the head of the line, resolved when it is this request's turn to
        ask; resolved at once if the line is free, or if ``deadline`` comes before the
        head's next ask (it cannot be covered)."""
        ticket: Ticket = asyncio.get_running_loop().create_future()
        if not self.busy:
            self.headed = True
            ticket.set_result(None)
        elif deadline < self.not_before:
            ticket.set_result(self.not_before)
        else:
            self._waiters.append(_Waiter(ticket, deadline))
        return ticket

    def defer(self, until: float) -> None:
        """The head was deferred until ``until``: waiters whose max_wait ends before that
        cannot be covered and are told now."""
        self.not_before = until
        if any(w.deadline < until for w in self._waiters):
            kept: deque[_Waiter] = deque()
            for w in self._waiters:
                if w.deadline < until and not w.ticket.done():
                    w.ticket.set_result(until)
                else:
                    kept.append(w)
            self._waiters = kept

    def leave(self) -> None:
        """The head is done asking (it got a turn, was refused or left): the next waiter
        heads the line; an empty line is forgotten."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.ticket.done():
                waiter.ticket.set_result(None)
                return
        self.headed = False
        if self._lines.get(self._name) is self:
            del self._lines[self._name]

    def abandon(self, ticket: Ticket) -> None:
        """A waiter leaves before asking (its client left, or its max_wait ran out). Had
        it just been made the head, the headship passes on."""
        if ticket.done() and not ticket.cancelled() and ticket.result() is None:
            self.leave()
            return
        ticket.cancel()
        self._waiters = deque(w for w in self._waiters if w.ticket is not ticket)
        if not self.busy and self._lines.get(self._name) is self:
            del self._lines[self._name]


class Lines:
    """Every line of this process, by (model group, client key)."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str], Line] = {}

    def busy(self, group: str, key: str) -> bool:
        line = self._lines.get((group, key))
        return line is not None and line.busy

    def line(self, group: str, key: str) -> Line:
        name = (group, key)
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = Line(self._lines, name)
        return line

    def __len__(self) -> int:
        return len(self._lines)


def turn_spacing(candidates: Sequence[DeploymentLimits], cost: Cost) -> float:
    """About how far apart a saturated group's turns come for a request like this one,
    across its deployments (0: unlimited). When a head gets a turn ``wait`` ahead, the
    next in line asks ``wait + spacing - lookahead`` later: when its own turn would fit
    in the lookahead, so it is not deferred once more for asking too soon (the count of
    round trips stays about one per request)."""
    paces = [
        max((w.cost(cost) * w.rate.interval for w in c.windows), default=0.0) for c in candidates
    ]
    per_second = depth(paces, 1.0)
    return 0.0 if per_second in (0.0, float("inf")) else 1.0 / per_second
