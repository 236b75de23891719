"""The admin page's spend view (``/admin?view=spend``), from ``GET /admin/spend``'s
documents (pure): today, this week and this month in total and by key, team and model,
then this month day by day, as a table and as a bar chart in inline SVG.

Spend reported without its usage (``estimated``: a stream cut before it, an answer
whose usage could not be read, a background response not read back yet: what its
budgets kept) is marked wherever it counts: ``≈`` before the dollars, "(2 estimated)"
beside the requests, hatched bars in the chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from proxy.api.admin_format import count, dollars
from proxy.limiter.base import Period
from proxy.money.spend import summed

__all__ = ["MAX_ROWS", "render_spend"]

Json = Mapping[str, Any]

MAX_ROWS = 50  # names shown per table (the month's biggest spenders); the rest in the API

_PERIODS: tuple[tuple[Period, str, str], ...] = (
    ("day", "Today", "yesterday"),
    ("week", "This week", "last week"),
    ("month", "This month", "last month"),
)
_NOBODY = {"key": "(no key)", "team": "(no team)", "model": "(no model)"}

# The chart's drawing box, in SVG units (scaled to the page's width).
_WIDTH, _HEIGHT, _LEFT, _TOP, _BOTTOM = 1100, 170, 70, 16, 22


def render_spend(reports: Mapping[Period, Json], refresh: int) -> str:
    """The view's body for the documents of ``day``, ``week`` and ``month`` (the month's
    with ``current.days``, ``admin_spend.read_views``), reloaded every ``refresh`` s."""
    month = reports["month"]["current"]
    parts = [
        "<h1>Spend</h1>",
        '<p class="meta">Dollars at each deployment&#39;s price, tokens and requests per'
        " calendar period (UTC), every replica&#39;s (a replica&#39;s last second is not"
        f" written yet) &middot; refreshes every {refresh} s &middot; download"
        ' <a href="/admin/spend?period=month&amp;format=csv">this month as CSV</a>'
        ' &middot; <a href="/admin/spend?period=month&amp;by_day=true">as JSON</a></p>',
        _summary(reports),
        *(_by(field, reports) for field in ("key", "team", "model")),
        f"<h2>This month day by day <span class=muted>from {_e(month['start'][:10])}</span></h2>",
        _chart(month),
        _days(month["days"]),
        '<p class="muted"><span class="est">&asymp;</span> includes estimated requests:'
        " charged without their usage (a stream cut before it, an answer whose usage could"
        " not be read, a background response not read back yet), reported at what their"
        " budgets kept until the usage is known.</p>",
    ]
    return "".join(parts)


def _summary(reports: Mapping[Period, Json]) -> str:
    rows = []
    for period, label, previous in _PERIODS:
        document = reports[period]
        current, before = document["current"], document["previous"]
        sums, past = summed(current["spend"]), summed(before["spend"])
        rows.append(
            f'<tr data-period="{period}"><td>{label} <span class="muted">'
            f"{'' if period == 'day' else 'since '}{_e(current['start'][:10])}</span></td>"
            f'{_sums(sums)}<td class="num">{_usd(past)} <span class="muted">{previous}</span>'
            "</td></tr>"
        )
    return (
        '<table class="spend-summary"><tr><th>period</th><th>dollars</th><th>requests</th>'
        "<th>input tokens</th><th>output tokens</th><th>estimated requests</th>"
        f"<th>the period before</th></tr>{''.join(rows)}</table>"
    )


def _by(field: str, reports: Mapping[Period, Json]) -> str:
    """One table: a row per ``field`` (key, team, model), a column per period."""
    sums: dict[str, dict[Period, dict[str, Any]]] = {}
    for period, _, _ in _PERIODS:
        for name, group in _grouped(reports[period]["current"]["spend"], field).items():
            sums.setdefault(name, {})[period] = summed(group)

    def biggest(item: tuple[str, dict[Period, dict[str, Any]]]) -> tuple[float, float, str]:
        month = item[1].get("month") or {"usd": 0.0, "requests": 0}
        return -month["usd"], -month["requests"], item[0]

    ranked = sorted(sums.items(), key=biggest)
    rows = [
        f'<tr data-{field}="{_e(name)}"><td>{_e(name or _NOBODY[field])}</td>'
        + "".join(_cell(periods.get(period), period) for period, _, _ in _PERIODS)
        + "</tr>"
        for name, periods in ranked[:MAX_ROWS]
    ]
    more = len(ranked) - MAX_ROWS
    if more > 0:
        rows.append(
            f'<tr><td colspan="4" class="muted">and {count(more)} more'
            " (<code>GET /admin/spend</code> has them all)</td></tr>"
        )
    if not rows:
        rows.append('<tr><td colspan="4" class="muted">no spend this month</td></tr>')
    heads = "".join(f"<th>{label}</th>" for _, label, _ in _PERIODS)
    return (
        f"<h2>By {field}</h2>"
        f'<table class="spend-by-{field}"><tr><th>{field}</th>{heads}</tr>{"".join(rows)}</table>'
    )


def _grouped(rows: Iterable[Json], field: str) -> dict[str, list[Json]]:
    groups: dict[str, list[Json]] = {}
    for row in rows:
        groups.setdefault(row[field], []).append(row)
    return groups


def _cell(sums: Json | None, period: Period) -> str:
    if sums is None:
        return f'<td class="num" data-period="{period}"><span class="muted">-</span></td>'
    tokens = sums["input_tokens"] + sums["output_tokens"]
    return (
        f'<td class="num" data-period="{period}">{_usd(sums)}<br><span class="muted">'
        f"{_requests(sums)} &middot; {count(tokens)} tokens</span></td>"
    )


def _sums(sums: Json) -> str:
    """The cells of a total: dollars, requests, input and output tokens, estimates."""
    return (
        f'<td class="num usd">{_usd(sums)}</td>'
        f'<td class="num requests">{count(sums["requests"])}</td>'
        f'<td class="num">{count(sums["input_tokens"])}</td>'
        f'<td class="num">{count(sums["output_tokens"])}</td>'
        f'<td class="num estimated">{count(sums["estimated"])}</td>'
    )


def _usd(sums: Json) -> str:
    """The dollars, ``≈`` before them when estimates are among them."""
    if not sums["estimated"]:
        return f"<b>{dollars(sums['usd'])}</b>"
    return (
        f'<b class="est" title="includes {count(sums["estimated"])} estimated">'
        f"&asymp; {dollars(sums['usd'])}</b>"
    )


def _requests(sums: Json) -> str:
    n = sums["requests"]
    text = f"{count(n)} {'request' if n == 1 else 'requests'}"
    if sums["estimated"]:
        text += f' <span class="est">({count(sums["estimated"])} estimated)</span>'
    return text


def _days(days: Sequence[Json]) -> str:
    rows = [
        f'<tr data-day="{_e(d["date"])}"><td>{_e(d["date"])}</td>{_sums(d)}</tr>'
        for d in reversed(days)  # the newest first
    ]
    return (
        '<table class="spend-days"><tr><th>day</th><th>dollars</th><th>requests</th>'
        "<th>input tokens</th><th>output tokens</th><th>estimated requests</th></tr>"
        f"{''.join(rows)}</table>"
    )


def _chart(month: Json) -> str:
    """A bar per day of the month (its days to come left empty): dollars, or requests
    when nothing is priced; a day with estimates hatched. Inline SVG, no script."""
    days: Sequence[Json] = month["days"]
    slots = max(len(days), round((_seconds(month["end"]) - _seconds(month["start"])) / 86400))
    priced = any(d["usd"] for d in days)
    measure = "usd" if priced else "requests"
    top = max((d[measure] for d in days), default=0) or 1
    show = dollars if priced else count
    step = (_WIDTH - _LEFT - 10) / slots
    plot = _HEIGHT - _TOP - _BOTTOM
    shapes = [
        '<defs><pattern id="est" width="6" height="6" patternUnits="userSpaceOnUse"'
        ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#7aa6d8"/>'
        '<rect width="2.5" height="6" fill="#e0a040"/></pattern></defs>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_WIDTH - 10}" y2="{_TOP}" stroke="#dde2e8"/>',
        f'<line x1="{_LEFT}" y1="{_TOP + plot}" x2="{_WIDTH - 10}" y2="{_TOP + plot}"'
        ' stroke="#8592a3"/>',
        f'<text x="{_LEFT - 6}" y="{_TOP + 4}" text-anchor="end">{show(top)}</text>',
        f'<text x="{_LEFT - 6}" y="{_TOP + plot}" text-anchor="end">0</text>',
    ]
    for i in range(slots):
        x = _LEFT + i * step
        shapes.append(
            f'<text x="{x + step / 2:.1f}" y="{_HEIGHT - 6}" text-anchor="middle">{i + 1}</text>'
        )
        if i < len(days):
            shapes.append(_bar(days[i], measure, top, x, step, plot))
    what = "dollars" if priced else "requests (nothing priced)"
    return (
        f'<svg class="spend-chart" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}"'
        f' height="{_HEIGHT}" role="img" aria-label="{what} per day this month"'
        ' font-family="system-ui,sans-serif" font-size="11" fill="#5a6675">'
        f"<title>{what} per day this month</title>{''.join(shapes)}</svg>"
        f'<p class="muted">Bars: {what} per day; hatched: includes estimated requests.</p>'
    )


def _bar(day: Json, measure: str, top: float, x: float, step: float, plot: float) -> str:
    height = max(plot * day[measure] / top, 1.0 if day[measure] else 0.0)
    fill = "url(#est)" if day["estimated"] else "#4a7fc1"
    estimated = f", {count(day['estimated'])} estimated" if day["estimated"] else ""
    return (
        f'<rect class="bar" data-day="{_e(day["date"])}" x="{x + step * 0.15:.1f}"'
        f' y="{_TOP + plot - height:.1f}" width="{step * 0.7:.1f}" height="{height:.1f}"'
        f' fill="{fill}"><title>{_e(day["date"])}: {dollars(day["usd"])},'
        f" {count(day['requests'])} requests{estimated}</title></rect>"
    )


def _seconds(iso: str) -> float:
    """Seconds since the epoch of ``spend``'s ``2025-06-01T00:00:00Z``."""
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _e(value: object) -> str:
    return escape(str(value), quote=True)
