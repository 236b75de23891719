"""What a showcase run measured, per side, and its table. *pure*"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["Attempt", "Call", "Side", "Summary", "from_first_request", "summarize", "table"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP request a client sent, in seconds from the run's start."""

    start: float
    end: float
    status: int
    waited: float = 0.0  # of it, waiting in the proxy for a turn (x-llm-proxy-queue-ms)


@dataclass(slots=True)
class Call:
    """One client call: its attempts (the SDK's retries), and whether it succeeded."""

    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None  # what the client raised in the end; None: success
    end: float = 0.0


@dataclass(frozen=True, slots=True)
class Side:
    """The calls of one side, and the 429s its upstream counted."""

    name: str
    calls: list[Call]
    upstream_429s: int


def from_first_request(sides: list[Side]) -> list[Side]:
    """The same, with times counted from the first request either side sent (the
    client's own start-up before it, the same for both sides, is not the scenario's)."""
    first = min((a.start for side in sides for c in side.calls for a in c.attempts), default=0.0)

    def call(c: Call) -> Call:
        attempts = [replace(a, start=a.start - first, end=a.end - first) for a in c.attempts]
        return Call(attempts, c.error, max(c.end - first, 0.0))

    return [replace(side, calls=[call(c) for c in side.calls]) for side in sides]


@dataclass(frozen=True, slots=True)
class Summary:
    name: str
    calls: int
    succeeded: int
    client_errors: int
    upstream_429s: int
    attempts: int
    time_to_finish: float  # seconds until the last call ended, in success or failure


def summarize(side: Side) -> Summary:
    errors = sum(1 for call in side.calls if call.error is not None)
    return Summary(
        name=side.name,
        calls=len(side.calls),
        succeeded=len(side.calls) - errors,
        client_errors=errors,
        upstream_429s=side.upstream_429s,
        attempts=sum(len(call.attempts) for call in side.calls),
        time_to_finish=max((call.end for call in side.calls), default=0.0),
    )


def table(summaries: list[Summary]) -> str:
    """A plain-text table, one row per side."""
    header = ("", "succeeded", "client errors", "upstream 429s", "HTTP requests", "finished in")
    rows = [
        (
            s.name,
            f"{s.succeeded}/{s.calls}",
            str(s.client_errors),
            str(s.upstream_429s),
            str(s.attempts),
            f"{s.time_to_finish:.1f} s",
        )
        for s in summaries
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest])

    return "\n".join([line(header), *(line(row) for row in rows)])
