"""``GET /admin``: the admin state as one self-contained HTML page (inline CSS and SVG, no
script, no external asset) that refreshes itself; ``?view=spend``: the spend view.

The state is rendered on the server into the page, and ``<meta http-equiv="refresh">``
reloads it every ``REFRESH`` seconds: the browser sends the reload with the same
``Authorization`` header it was given (its login prompt's Basic credentials, a reverse
proxy in front, a header extension, a DevTools session), so no key ever goes into a URL,
a cookie or a script. ``render`` is pure: the state in (``state_view``), the page out;
the spend view's is ``admin_spend_view.render_spend``.

Every figure says what it is of and in which unit (admin_format.py): "112 of 120
requests per minute left, full again in 0.5 s"; a table's first header row says which
columns are rate limits (rolling windows), budgets (calendar periods) or what is
happening now.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.api.admin_format import count, dollars, duration, number, per, rate, unit, utc
from proxy.api.admin_spend import SpendUnavailable, read_views
from proxy.api.admin_spend_view import render_spend
from proxy.api.admin_state import requested_state
from proxy.api.responses import error_response
from proxy.errors import ProxyError

__all__ = ["REFRESH", "SPEND_REFRESH", "admin_page", "page", "render"]

REFRESH = 5  # seconds between reloads
SPEND_REFRESH = 30  # the spend view's: it reads whole periods, written once a second

Json = Mapping[str, Any]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2733;background:#f6f7f9}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .2em}
nav{margin:0 0 .6em}nav a{margin-right:1em}nav a.on{font-weight:600;color:#1d2733}
.meta{color:#5a6675;margin-bottom:.6em}p{margin:.2em 0 .5em}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:.5em}
th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}
tr.groups th{background:#e1e6ed;font-weight:600;font-size:.85em;color:#3b4756}
tr.groups th.rate{background:#dde9f7}tr.groups th.budget{background:#efe4f6}
tr.groups th.now{background:#e2f1e6}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.state{font-weight:600;border-radius:3px;padding:0 .4em}
.healthy,.current{background:#d7f5dd;color:#17642a}.held,.unread{background:#fff1c2;color:#7a5800}
.cooling,.probing,.probe_next,.unreachable,.lost{background:#ffd9d6;color:#8f1d14}
.window+.window,.budget+.budget{margin-top:.2em}.muted{color:#8592a3}.est{color:#8a4b00}
.store{padding:.3em .5em;border:1px solid #dde2e8;background:#fff;margin:.4em 0}
.store.warn{border-color:#e0a39d;background:#fff4f3}
svg{background:#fff;border:1px solid #dde2e8;max-width:100%}
"""

_PERIOD_WORDS = {"day": "today", "week": "this week", "month": "this month"}


def page(title: str, view: str, body: Iterable[str], refresh: int = REFRESH) -> str:
    """The page around ``body``: its head (inline CSS, a reload every ``refresh``
    seconds) and the navigation between its views (``view``: ``state`` or ``spend``)."""
    links = [("state", "/admin", "State"), ("spend", "/admin?view=spend", "Spend")]
    nav = " ".join(
        f'<a href="{href}"{" class=on" if name == view else ""}>{text}</a>'
        for name, href, text in links
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{refresh}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f'<body><nav>{nav} <a href="/admin/key-manager">Manage keys</a></nav>'
        f"{''.join(body)}</body></html>"
    )


def render(view: Json) -> str:
    """The page for one admin state (``state_view.state``)."""
    limiter = view["limiter"]
    replicas = limiter["replicas_reporting"]
    body = [
        "<h1>llm-proxy state</h1>",
        f'<div class="meta">at <span id="time">{_e(utc({"at": view["time"]}, seconds=True))}</span>'
        f' &middot; limiter <b id="mode">{_e(limiter["mode"])}</b> ({_e(limiter["scope"])},'
        f" {count(replicas)} {'replica' if replicas == 1 else 'replicas'} reporting)"
        f' &middot; <b id="waiting">{count(view["waiting"])}</b>'
        f" {_requests(view['waiting'])} waiting"
        f" &middot; refreshes every {REFRESH} s</div>",
    ]
    if "key_store" in view:
        body.append(_key_store(view["key_store"]))
    for model in view["models"]:
        body.append(f'<h2 id="model-{_e(model["name"])}">Model {_e(model["name"])}</h2>')
        body.append(_model_waiting(model))
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
            f'<p class="muted">Without a key: {count(anonymous["waiting"])} waiting,'
            f" {count(anonymous['in_flight'])} in flight</p>"
        )
    return page("llm-proxy state", "state", body)


async def admin_page(request: Request) -> Response:
    """``?page=N&per_page=M``: which page of the client keys, as ``/admin/state``;
    ``?view=spend``: the spend view instead."""
    if request.query_params.get("view") == "spend":
        return await _spend_page(request)
    try:
        view = await requested_state(request)
    except ProxyError as error:
        return error_response(error)
    return HTMLResponse(render(view), headers={"cache-control": "no-store"})


async def _spend_page(request: Request) -> Response:
    now = time.time()
    try:
        body = render_spend(await read_views(request.app.state.ledger, now), SPEND_REFRESH)
    except SpendUnavailable:  # shown, and tried again at the next refresh
        body = (
            "<h1>Spend</h1><p id=spend-unavailable>The spend report's storage does not answer;"
            f" this page tries again in {SPEND_REFRESH} s.</p>"
        )
    html = page("llm-proxy spend", "spend", [body], SPEND_REFRESH)
    return HTMLResponse(html, headers={"cache-control": "no-store"})


def _requests(n: float) -> str:
    return "request" if n == 1 else "requests"


def _key_store(store: Json) -> str:
    """The admin API's key store: read or not, and whether it ever lost its data."""
    state = store["state"]
    losses = store["losses_detected"]
    lost = store["last_loss"]
    detail = "no loss of its data detected"
    if losses:
        detail = (
            f"<b>lost its data {count(losses)} {'time' if losses == 1 else 'times'}</b>"
            f"; last at {_e(lost['at'])}: {_e(lost['reason'])}, {_e(lost['outcome'])}"
        )
        if "written_back" in lost:
            detail += (
                f" ({count(lost['written_back'])} written back, {count(lost['keys_gone'])} gone)"
            )
    keys = store["keys"]
    warn = " warn" if losses or state != "current" else ""
    return (
        f'<p id="key-store" class="store{warn}" data-state="{_e(state)}">'
        f"Key store (client keys made through the admin API, {_e(store['backend'])}):"
        f' <span class="state {_e(state)}">{_e(state)}</span>'
        f" &middot; {count(keys)} {'key' if keys == 1 else 'keys'} &middot; {detail}</p>"
    )


def _model_waiting(model: Json) -> str:
    """A model's waiting requests, and how they split: those holding a turn on one of its
    deployments (each counted in its row) and those waiting for any of them."""
    waiting = model["waiting"]
    anywhere = model["waiting_for_any_deployment"]
    if not waiting:
        return '<p class="muted model-waiting" data-waiting="0">Nothing waiting.</p>'
    return (
        f'<p class="model-waiting" data-waiting="{_e(waiting)}"><b>{count(waiting)}</b>'
        f" {_requests(waiting)} waiting: <b>{count(waiting - anywhere)}</b> for a turn on a"
        f" deployment below, <b class=any-waiting>{count(anywhere)}</b> for any deployment"
        ' <span class="muted">(no turn yet: deferred for fair share, or every deployment'
        " cooling down)</span></p>"
    )


def _pages(at: Json) -> str:
    """Links to the neighbouring pages of keys (plain links: the refresh keeps the page)."""
    page_no, pages, per_page = at["page"], at["pages"], at["per_page"]
    links = [
        f'<a href="?page={p}&amp;per_page={_e(per_page)}">{p}</a>'
        if p != page_no
        else f"<b>{p}</b>"
        for p in range(max(1, page_no - 5), min(pages, page_no + 5) + 1)
    ]
    return (
        f'<p class="muted" id="key-pages">{count(at["total"])} keys; page {" ".join(links)}'
        f' of {count(pages)} &middot; <a href="/admin/key-manager">manage keys</a></p>'
    )


# The first header row of each table: which columns are rate limits, budgets, or now.
_RATE = (
    '<th class="rate">Rate limits: what is left of each window'
    ' <span class="muted">(rolling: refills continuously)</span></th>'
)
_BUDGET = (
    '<th class="budget">Budgets: what is left of each'
    ' <span class="muted">(calendar periods, UTC: all returns at the reset)</span></th>'
)


def _deployments(deployments: Iterable[Json]) -> str:
    rows = []
    for d in deployments:
        health = d["health"]
        state = health["state"]
        detail = [
            f"{label} {_when(health[field])}"
            for label, field in (
                ("cooldown ends", "cooldown_until"),
                ("probe due back", "probe_until"),
                ("429 hold ends", "hold_until"),
            )
            if health[field] is not None
        ]
        learned = d["learned"]
        upstream = d["upstream_model"] or "the name asked for"  # a pattern group's: None
        rows.append(
            f'<tr data-deployment="{_e(d["id"])}" data-health="{_e(state)}">'
            f'<td>{_e(d["id"])}<br><span class="muted">{_e(upstream)}</span></td>'
            f'<td><span class="state {_e(state)}">{_e(state)}</span>'
            f"{'<br>' + '<br>'.join(detail) if detail else ''}</td>"
            f"<td>{_windows(d['windows'])}</td>"
            f'<td class="num in-flight">{count(d["in_flight"])}</td>'
            f'<td class="num waiting">{count(d["waiting"])}</td>'
            f'<td class="num next-turn">{_when(d["next_turn"])}</td>'
            "<td>"
            + (
                f"{rate(learned['requests_per_minute'])} requests per minute"
                if learned
                else '<span class="muted">-</span>'
            )
            + "</td></tr>"
        )
    return (
        '<table class="deployments"><tr class="groups"><th colspan="2">Deployment</th>'
        f'{_RATE}<th class="now" colspan="3">Now</th><th>Learned from 429s</th></tr>'
        "<tr><th>deployment</th><th>health</th><th>left of limit</th><th>in flight</th>"
        "<th>waiting for its turn</th><th>next free turn</th><th>rate</th></tr>"
        f"{''.join(rows)}</table>"
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
        '<table class="teams"><tr class="groups"><th>Team</th>'
        f'{_RATE}{_BUDGET}<th class="now">Now</th></tr>'
        "<tr><th>team</th><th>left of limit</th><th>left of budget</th>"
        f"<th>parallel slots held</th></tr>{''.join(rows)}</table>"
    )


def _slots(owner: Json) -> str:
    if owner["max_parallel"] is None:
        return '<span class="muted">no limit</span>'
    return f"{count(owner['slots_held'])} of {count(owner['max_parallel'])}"


def _keys(keys: Iterable[Json]) -> str:
    rows = []
    for k in keys:
        team = f'<br><span class="muted">team {_e(k["team"])}</span>' if k["team"] else ""
        rows.append(
            f'<tr data-key="{_e(k["name"])}"><td>{_e(k["name"])}{team}</td>'
            f"<td>{_windows(k['windows'])}</td>"
            f"<td>{_budgets(k['budgets'])}</td>"
            f'<td class="num slots">{_slots(k)}</td>'
            f'<td class="num in-flight">{count(k["in_flight"])}</td>'
            f'<td class="num waiting">{count(k["waiting"])}</td>'
            f'<td class="num">{number(k["priority"])} &middot; {number(k["weight"])}</td></tr>'
        )
    return (
        '<table class="keys"><tr class="groups"><th>Key</th>'
        f'{_RATE}{_BUDGET}<th class="now" colspan="3">Now</th><th>Fair share</th></tr>'
        "<tr><th>key</th><th>left of limit</th><th>left of budget</th>"
        "<th>parallel slots held</th><th>in flight</th><th>waiting</th>"
        f"<th>priority &middot; weight</th></tr>{''.join(rows)}</table>"
    )


def _windows(windows: Iterable[Json]) -> str:
    """Each window: "112 of 120 requests per minute left, full again in 0.5 s"; one that
    holds less than its limit at once (a deployment's burst, a paced window): "0 of 1
    request left, refilling 56.57 per minute". The limit is the one in force here (after
    pacing, this worker's share, what the upstream announced); the configured one beside
    it when they differ."""
    parts = []
    for w in windows:
        limit, capacity, kind = w["limit"], w.get("capacity", w["limit"]), w["kind"]
        if capacity == limit:
            amount = f"{number(limit)} {unit(kind, limit)} {per(w['per_seconds'])} left"
        else:
            amount = (
                f"{number(capacity)} {unit(kind, capacity)} left, refilling {rate(limit)}"
                f" {per(w['per_seconds'])}"
            )
        scope = f" ({_e(', '.join(w['models']))} only)" if w["models"] else ""
        full = w["full_in"]
        refill = "full" if full["in"] <= 0 else f"full again {_when(full)}"
        parts.append(
            f'<div class="window" data-window="{_e(w["name"])}"><b>{count(w["remaining"])}</b>'
            f" of {amount}{scope}{_configured(w)}, {refill}</div>"
        )
    return "".join(parts) or '<span class="muted">unlimited</span>'


def _configured(w: Json) -> str:
    configured = w["configured"]
    if configured is None:
        return ' <span class="muted">(no longer configured)</span>'
    if configured == w["limit"]:
        return ""
    title = (
        "in force here: less the pacing margin, this worker&#39;s share without Redis,"
        " or what the upstream announced"
    )
    return f' <span class="muted" title="{title}">(configured {count(configured)})</span>'


def _budgets(budgets: Iterable[Json]) -> str:
    """Each budget: "$12.34 of $50.00 left this month, resets in 9 d" (the moment as its
    tooltip); all of it returns at the period's end."""
    parts = []
    for b in budgets:
        kind = b["kind"]
        scope = f" ({_e(', '.join(b['models']))} only)" if b["models"] else ""
        if kind == "usd":
            left, limit = dollars(b["remaining"]), dollars(b["limit"])
        else:
            left, limit = count(b["remaining"]), f"{count(b['limit'])} {unit(kind, b['limit'])}"
        resets = b["resets"]
        parts.append(
            f'<div class="budget" data-budget="{_e(b["name"])}"><b>{left}</b> of {limit}'
            f" left {_PERIOD_WORDS.get(b['period'], _e(b['period']))}{scope}, resets"
            f" {_when(resets)}</div>"
        )
    return "".join(parts) or '<span class="muted">none</span>'


def _when(moment: Json) -> str:
    """``now``, or ``in 2.5 s`` with the absolute time as a tooltip."""
    seconds = moment["in"]
    if seconds <= 0:
        return "now"
    return f'<span title="{_e(moment["at"])}">in {duration(seconds)}</span>'


def _e(value: object) -> str:
    return escape(str(value), quote=True)
