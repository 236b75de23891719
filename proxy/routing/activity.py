"""What this replica is doing now, which no limiter knows (pure): requests sleeping for a
turn (per model group, per deployment their turn is on, per client key) and upstream
calls under way per key. The dispatcher counts; ``report`` is what the replica publishes
with its heartbeat (limiter/base.py ``Activity``) for the admin state."""

from __future__ import annotations

from collections.abc import Mapping

from proxy.limiter.base import Activity

__all__ = ["Tally"]


class Tally:
    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}
        self.waiting_on: dict[str, int] = {}
        self.waiting_keys: dict[str, int] = {}
        self.in_flight_keys: dict[str, int] = {}

    def wait_started(self, group: str, deployment: str | None, key: str | None) -> None:
        """A request starts sleeping, for a turn on ``deployment`` (None: for a model
        whose deployments are all cooling, or for its fair share)."""
        _add(self.waiting, group, 1)
        if deployment is not None:
            _add(self.waiting_on, deployment, 1)
        _add(self.waiting_keys, key or "", 1)

    def wait_ended(self, group: str, deployment: str | None, key: str | None) -> None:
        _add(self.waiting, group, -1)
        if deployment is not None:
            _add(self.waiting_on, deployment, -1)
        _add(self.waiting_keys, key or "", -1)

    def call_started(self, key: str | None) -> None:
        _add(self.in_flight_keys, key or "", 1)

    def call_ended(self, key: str | None) -> None:
        _add(self.in_flight_keys, key or "", -1)

    def report(self, in_flight: Mapping[str, int]) -> Activity:
        """A copy to publish, with the upstream calls per deployment (the dispatcher's)."""
        return Activity(
            waiting=dict(self.waiting),
            waiting_on=dict(self.waiting_on),
            waiting_keys=dict(self.waiting_keys),
            in_flight={d: n for d, n in in_flight.items() if n},
            in_flight_keys=dict(self.in_flight_keys),
        )


def _add(counts: dict[str, int], name: str, delta: int) -> None:
    """Counts stay small: a name at zero is dropped."""
    n = counts.get(name, 0) + delta
    if n:
        counts[name] = n
    else:
        counts.pop(name, None)
