"""``GET /admin``: the admin state as one self-contained HTML page (inline CSS, no script,
no external asset) that refreshes itself.

The state is rendered on the server into the page, and ``<meta http-equiv="refresh">``
reloads it every ``REFRESH`` seconds: the browser sends the reload with the same
``Authorization`` header it was given (whatever added it: a reverse proxy in front, a
header extension, a DevTools session), so no key ever goes into a URL, a cookie or a
script. ``render`` is pure: the state in (``state_view``), the page out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.api.admin_state import requested_state
from proxy.api.responses import error_response
from proxy.errors import ProxyError

__all__ = ["REFRESH", "admin_page", "render"]

REFRESH = 5  # seconds between reloads

Json = Mapping[str, Any]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2733;background:#f6f7f9}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.meta{color:#5a6675;margin-bottom:1em}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:.5em}
th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.state{font-weight:600;border-radius:3px;padding:0 .4em}
.healthy{background:#d7f5dd;color:#17642a}.held{background:#fff1c2;color:#7a5800}
.cooling,.probing,.probe_next{background:#ffd9d6;color:#8f1d14}
.window{white-space:nowrap}.muted{color:#8592a3}
"""


def render(view: Json) -> str:
    """The page for one admin state (``state_view.state``)."""
    limiter = view["limiter"]
    body = [
        "<h1>llm-proxy state</h1>",
        f'<div class="meta">at <span id="time">{_e(view["time"])}</span>'
        f' &middot; limiter <b id="mode">{_e(limiter["mode"])}</b> ({_e(limiter["scope"])},'
        f" {_e(limiter['replicas_reporting'])} replica(s) reporting)"
        f' &middot; waiting <b id="waiting">{_e(view["waiting"])}</b>'
        f" &middot; refreshes every {REFRESH} s</div>",
    ]
    for model in view["models"]:
        body.append(
            f'<h2 id="model-{_e(model["name"])}">Model {_e(model["name"])}'
            f' <span class="muted">waiting {_e(model["waiting"])}</span></h2>'
        )
        body.append(_deployments(model["deployments"]))
    if view["teams"]:
        body.append("<h2>Teams</h2>")
        body.append(_teams(view["teams"]))
    body.append("<h2>Client keys</h2>")
    if "keys_page" in view:
        body.append(_pages(view["keys_page"]))
    body.append(_keys(view["keys"]) if view["keys"] else '<p class="muted">none configured</p>')
    anonymous = view["without_key"]
    if anonymous["waiting"] or anonymous["in_flight"]:
        body.append(
            f'<p class="muted">Without a key: waiting {_e(anonymous["waiting"])},'
            f" in flight {_e(anonymous['in_flight'])}</p>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>llm-proxy state</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )


async def admin_page(request: Request) -> Response:
    """``?page=N&per_page=M``: which page of the client keys, as ``/admin/state``."""
    try:
        view = await requested_state(request)
    except ProxyError as error:
        return error_response(error)
    return HTMLResponse(render(view), headers={"cache-control": "no-store"})


def _pages(at: Json) -> str:
    """Links to the neighbouring pages of keys (plain links: the refresh keeps the page)."""
    page, pages, per_page = at["page"], at["pages"], at["per_page"]
    links = [
        f'<a href="?page={p}&amp;per_page={_e(per_page)}">{p}</a>' if p != page else f"<b>{p}</b>"
        for p in range(max(1, page - 5), min(pages, page + 5) + 1)
    ]
    return (
        f'<p class="muted" id="key-pages">{_e(at["total"])} keys; page {" ".join(links)}'
        f' of {_e(pages)} &middot; <a href="/admin/key-manager">manage keys</a></p>'
    )


def _deployments(deployments: Iterable[Json]) -> str:
    rows = []
    for d in deployments:
        health = d["health"]
        state = health["state"]
        detail = []
        for label, field in (
            ("cooldown ends", "cooldown_until"),
            ("probe due back", "probe_until"),
            ("429 hold ends", "hold_until"),
        ):
            if health[field] is not None:
                detail.append(f"{label} {_when(health[field])}")
        learned = d["learned"]
        rows.append(
            f'<tr data-deployment="{_e(d["id"])}" data-health="{_e(state)}">'
            f'<td>{_e(d["id"])}<br><span class="muted">{_e(d["upstream_model"])}</span></td>'
            f'<td><span class="state {_e(state)}">{_e(state)}</span>'
            f"{'<br>' + '<br>'.join(detail) if detail else ''}</td>"
            f'<td class="num next-turn">{_when(d["next_turn"])}</td>'
            f'<td class="num in-flight">{_e(d["in_flight"])}</td>'
            f'<td class="num waiting">{_e(d["waiting"])}</td>'
            f"<td>{_windows(d['windows'])}</td>"
            f"<td>{_e(learned['requests_per_minute']) + ' rpm' if learned else '-'}</td></tr>"
        )
    return (
        "<table><tr><th>deployment</th><th>health</th><th>next turn</th><th>in flight</th>"
        "<th>waiting</th><th>budget left (limit, configured; full in)</th>"
        f"<th>learned</th></tr>{''.join(rows)}</table>"
    )


def _teams(teams: Iterable[Json]) -> str:
    rows = [
        f'<tr data-team="{_e(t["name"])}"><td>{_e(t["name"])}</td>'
        f"<td>{_windows(t['windows'])}</td>"
        f"<td>{_budgets(t['budgets'])}</td>"
        f'<td class="num slots">{_slots(t)}</td></tr>'
        for t in teams
    ]
    return (
        "<table><tr><th>team</th><th>budget left (limit, configured; full in)</th>"
        "<th>budgets (left of limit; resets)</th>"
        f"<th>parallel slots held</th></tr>{''.join(rows)}</table>"
    )


def _slots(owner: Json) -> str:
    if owner["max_parallel"] is None:
        return "-"
    return f"{_e(owner['slots_held'])} / {_e(owner['max_parallel'])}"


def _keys(keys: Iterable[Json]) -> str:
    rows = []
    for k in keys:
        parallel = _slots(k)
        team = f'<br><span class="muted">team {_e(k["team"])}</span>' if k["team"] else ""
        rows.append(
            f'<tr data-key="{_e(k["name"])}"><td>{_e(k["name"])}{team}</td>'
            f"<td>{_windows(k['windows'])}</td>"
            f"<td>{_budgets(k['budgets'])}</td>"
            f'<td class="num slots">{parallel}</td>'
            f'<td class="num in-flight">{_e(k["in_flight"])}</td>'
            f'<td class="num waiting">{_e(k["waiting"])}</td>'
            f'<td class="num">{_e(k["priority"])} / {_e(k["weight"])}</td></tr>'
        )
    return (
        "<table><tr><th>key</th><th>budget left (limit, configured; full in)</th>"
        "<th>budgets (left of limit; resets)</th><th>parallel slots held</th>"
        "<th>in flight</th><th>waiting</th>"
        f"<th>priority / weight</th></tr>{''.join(rows)}</table>"
    )


def _windows(windows: Iterable[Json]) -> str:
    parts = []
    for w in windows:
        configured = "" if w["configured"] is None else f", {_e(w['configured'])}"
        parts.append(
            f'<div class="window" data-window="{_e(w["name"])}">{_e(w["name"])}:'
            f" {_e(_num(w['remaining']))} ({_e(_num(w['limit']))}{configured};"
            f" {_when(w['full_in'])})</div>"
        )
    return "".join(parts) or '<span class="muted">unlimited</span>'


def _budgets(budgets: Iterable[Json]) -> str:
    """Each budget: what is left of its period's quota, and when it all returns (a date:
    a month is too long to count in seconds)."""
    parts = []
    for b in budgets:
        scope = f" ({_e(', '.join(b['models']))})" if b["models"] else ""
        parts.append(
            f'<div class="budget" data-budget="{_e(b["name"])}">{_e(b["kind"])} per'
            f" {_e(b['period'])}{scope}: {_e(_num(b['remaining']))} left of"
            f" {_e(_num(b['limit']))}; resets {_e(b['resets']['at'])}</div>"
        )
    return "".join(parts) or '<span class="muted">none</span>'


def _when(moment: Json) -> str:
    """``now``, or ``in 2.5 s`` with the absolute time as a tooltip."""
    seconds = moment["in"]
    if seconds <= 0:
        return "now"
    return f'<span title="{_e(moment["at"])}">in {_e(_num(seconds))} s</span>'


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _e(value: object) -> str:
    return escape(str(value), quote=True)
