"""Who spent what: spend records per key, team and model per calendar period (pure).

Every answered request a budget or window is charged for adds one ``Spend`` (dollars,
input and output tokens, one request) to its (key, team, model) in the day, the week
and the month it *started* in (a stream that ends after midnight is yesterday's): its
usage priced, or, when no usage was read (a stream cut before it, a background
response), what its budgets were charged instead, counted as ``estimated``. A
background response's estimate is ``Held`` until its usage is read (``GET
/v1/responses/{id}``), then corrected once (``correction``). ``Tally`` sums them until
the ledger writes them (money/ledger.py); ``report`` turns the stored totals of a
period and the one before it into ``GET /admin/spend``'s rows, JSON or CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from proxy.limiter.base import Period
from proxy.limiter.core import periods
from proxy.values import value

FIELDS: tuple[str, ...] = ("usd", "input_tokens", "output_tokens", "requests", "estimated")
SEP = "\t"  # between a record's parts in a stored field name (no key name holds a tab)


@value
class Owner:
    """Whose spend: a client key ("" for none), its team ("" for none), a model group."""

    key: str
    team: str
    model: str


@value
class Spend:
    """One request's (``requests`` 1), or a correction of one's (0). ``estimated``: 1 when
    its figures are what its budgets were charged, no usage being known (-1: such an
    estimate replaced by the usage)."""

    usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 1
    estimated: int = 0


@value
class Held:
    """A request whose usage is not known yet (a background response): who it is
    reported for, when it started, the deployment that has it, the estimate reported
    (``spend``) and what its budgets were charged (``reserved``, kind -> amount; empty:
    none applied). Settled once when its usage is read."""

    owner: Owner
    started: float
    deployment: str
    spend: Spend
    reserved: Mapping[str, float]

    def encode(self) -> bytes:
        o, s = self.owner, self.spend
        fields = [o.key, o.team, o.model, self.started, self.deployment]
        return orjson.dumps([*fields, s.usd, s.input_tokens, s.output_tokens, self.reserved])

    @staticmethod
    def decode(data: str | bytes) -> Held | None:
        """A record as ``encode`` wrote it; None for anything else (never trusted)."""
        try:
            f = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not (isinstance(f, list) and len(f) == 9 and isinstance(f[8], dict)):
            return None
        if not all(isinstance(x, str) for x in f[:3] + f[4:5]):
            return None
        numbers = [f[3], f[5], f[6], f[7], *f[8].values()]
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
            return None
        spend = Spend(float(f[5]), int(f[6]), int(f[7]), estimated=1)
        reserved = {str(k): float(v) for k, v in f[8].items()}
        return Held(Owner(f[0], f[1], f[2]), float(f[3]), f[4], spend, reserved)


def correction(held: Spend, real: Spend) -> Spend:
    """What turns a held estimate into the real spend: no request more, one estimate
    fewer."""
    return Spend(
        real.usd - held.usd,
        real.input_tokens - held.input_tokens,
        real.output_tokens - held.output_tokens,
        requests=0,
        estimated=-1,
    )


def field_name(metric: str, owner: Owner) -> str:
    """A stored total's name: the metric and the owner (``usd\\talice\\t\\tgpt-4o``)."""
    return SEP.join((metric, owner.key, owner.team, owner.model))


def parse_field(name: str) -> tuple[str, Owner] | None:
    """``field_name``'s inverse; None for a name of another layout."""
    parts = name.split(SEP)
    if len(parts) != 4 or parts[0] not in FIELDS:
        return None
    return parts[0], Owner(parts[1], parts[2], parts[3])


Totals = dict[tuple[Period, int], dict[str, float]]  # (period, index) -> field -> sum


class Tally:
    """Spend summed per owner and UTC day: adding one is a dict lookup and four additions
    (on every answered request); ``totals`` spreads the days over their periods."""

    def __init__(self) -> None:
        # (key, team, model, day): strings and an int hash and compare in C, an
        # ``Owner`` through its dataclass methods (this runs on every answered request).
        self.days: dict[tuple[str, str, str, int], list[float]] = {}

    def add(self, owner: Owner, spend: Spend, started: float) -> int:
        """Count ``spend`` in the UTC day ``started`` falls in; returns that day."""
        day = periods.index("day", started)
        slot = (owner.key, owner.team, owner.model, day)
        sums = self.days.get(slot)
        if sums is None:
            sums = self.days[slot] = [0.0] * len(FIELDS)
        sums[0] += spend.usd  # FIELDS' order
        sums[1] += spend.input_tokens
        sums[2] += spend.output_tokens
        sums[3] += spend.requests
        sums[4] += spend.estimated
        return day

    def totals(self) -> Totals:
        """What the days sum to, per period (day, week, month) and field name."""
        out: Totals = {}
        for (key, team, model, day), sums in self.days.items():
            owner = Owner(key, team, model)
            t = day * periods.DAY
            for period in periods.PERIODS:
                fields = out.setdefault((period, periods.index(period, t)), {})
                for metric, amount in zip(FIELDS, sums, strict=True):
                    if amount:
                        name = field_name(metric, owner)
                        fields[name] = fields.get(name, 0.0) + amount
        return out

    def take(self) -> Tally:
        """Everything summed so far, as a tally of its own; this one starts empty."""
        taken = Tally()
        taken.days, self.days = self.days, {}
        return taken

    def merge(self, other: Tally) -> None:
        """Put back what could not be written (added to whatever came since)."""
        for slot, sums in other.days.items():
            mine = self.days.setdefault(slot, [0.0] * len(FIELDS))
            for i, amount in enumerate(sums):
                mine[i] += amount

    def forget_before(self, day: int) -> None:
        for slot in [s for s in self.days if s[3] < day]:
            del self.days[slot]


def rows(stored: Mapping[str, float]) -> list[dict[str, Any]]:
    """One period's stored totals as rows, one per (key, team, model), sorted."""
    by_owner: dict[Owner, dict[str, float]] = {}
    for name, amount in stored.items():
        parsed = parse_field(name)
        if parsed is not None:
            metric, owner = parsed
            by_owner.setdefault(owner, dict.fromkeys(FIELDS, 0.0))[metric] += amount
    return [
        {
            "key": owner.key,
            "team": owner.team,
            "model": owner.model,
            "usd": round(totals["usd"], 10),
            "input_tokens": int(totals["input_tokens"]),
            "output_tokens": int(totals["output_tokens"]),
            "requests": int(totals["requests"]),
            "estimated": int(totals["estimated"]),
        }
        for owner, totals in sorted(
            by_owner.items(), key=lambda item: (item[0].key, item[0].team, item[0].model)
        )
    ]


def summed(spend: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows (``rows``' or any part of them) added up: dollars, tokens, requests and the
    estimated requests among them."""
    sums: dict[str, Any] = {"usd": 0.0, **dict.fromkeys(FIELDS[1:], 0)}
    for row in spend:
        for metric in FIELDS:
            sums[metric] += row[metric]
    sums["usd"] = round(sums["usd"], 10)
    return sums


def report(
    period: Period,
    now: float,
    current: Mapping[str, float],
    previous: Mapping[str, float],
    days: Iterable[Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """``GET /admin/spend``'s JSON: the period ``now`` falls in and the one before;
    ``days``: the stored totals of each day of the current period up to ``now``'s, in
    order, shown as ``current.days`` (each day's sums, no rows)."""
    span = periods.span(period, now)
    before = periods.Span(span.index - 1, periods.start(period, span.index - 1), span.start)
    document: dict[str, Any] = {
        "period": period,
        "current": _period(span, rows(current)),
        "previous": _period(before, rows(previous)),
    }
    if days is not None:
        first = periods.index("day", span.start)
        document["current"]["days"] = [_day(first + i, stored) for i, stored in enumerate(days)]
    return document


def days_of(period: Period, now: float) -> range:
    """The day indices of ``now``'s period up to ``now``'s day: what ``report`` shows
    day by day."""
    return range(
        periods.index("day", periods.span(period, now).start), periods.index("day", now) + 1
    )


def _day(day: int, stored: Mapping[str, float]) -> dict[str, Any]:
    start = periods.start("day", day)
    return {
        "date": _iso(start)[:10],
        "start": _iso(start),
        "end": _iso(start + periods.DAY),
        **summed(rows(stored)),
    }


def _period(span: periods.Span, spend: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "start": _iso(span.start),
        "end": _iso(span.end),
        "total_usd": round(sum(r["usd"] for r in spend), 10),
        "spend": spend,
    }


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


CSV_COLUMNS = ("period_start", "period_end", "key", "team", "model", *FIELDS)


def to_csv(document: Mapping[str, Any]) -> str:
    """``report``'s rows as CSV, the previous period first (a spreadsheet's order)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for which in ("previous", "current"):
        part = document[which]
        writer.writerows(_csv_rows(part["start"], part["end"], part["spend"]))
    return out.getvalue()


def _csv_rows(start: str, end: str, spend: Iterable[Mapping[str, Any]]) -> list[list[Any]]:
    return [[start, end, *(_cell(r[c]) for c in CSV_COLUMNS[2:])] for r in spend]


def _cell(value: object) -> object:
    # A name a spreadsheet would run as a formula is quoted as text (CSV injection).
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value
