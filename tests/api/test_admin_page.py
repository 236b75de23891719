"""The admin page's rendering (pure): names from the config are escaped, nothing external."""

from __future__ import annotations

import re
from typing import Any

from support.proxy_server import settings_from

from proxy.api.admin_page import render
from proxy.api.admin_spend_view import render_spend
from proxy.api.admin_state_view import Reading, state
from proxy.catalog.catalog import Catalog
from proxy.limiter.base import Activity, KeyState, LimiterMode, Quota, QuotaUsage


def test_names_are_escaped_and_the_page_is_self_contained() -> None:
    settings = settings_from(
        {
            "keys": [{"name": "<b>k</b>", "key": "sk-a"}],
            "models": [{"name": "m&<i>", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    html = render(state(settings, Catalog(settings), Reading(0.0, LimiterMode.MEMORY, {}, {}, [])))
    assert "<b>k</b>" not in html and "&lt;b&gt;k&lt;/b&gt;" in html
    assert "m&amp;&lt;i&gt;" in html and "m&<i>" not in html
    assert "<script" not in html and "<link" not in html and "src=" not in html


def test_teams_have_their_table_and_keys_name_their_team() -> None:
    settings = settings_from(
        {
            "teams": [{"name": "<t>", "rpm": 10}],
            "keys": [{"name": "k", "key": "sk-a", "team": "<t>"}],
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    html = render(state(settings, Catalog(settings), Reading(0.0, LimiterMode.MEMORY, {}, {}, [])))
    assert "<h2>Teams</h2>" in html and 'data-team="&lt;t&gt;"' in html
    assert 'data-window="rpm"' in html and "team &lt;t&gt;" in html


def test_each_table_says_which_columns_are_rate_limits_and_which_budgets() -> None:
    settings = settings_from(
        {
            "teams": [{"name": "t", "rpm": 10, "budgets": [{"usd": 50, "period": "month"}]}],
            "keys": [{"name": "k", "key": "sk-a", "team": "t", "rpm": 120}],
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    month = Quota("budget_usd_month", "usd", 50.0, "month", scope="team", owner="t")
    spent = KeyState(budgets=((month, QuotaUsage(50.0, 12.345, 86400.0, 9 * 86400.0)),))
    keys = {"k": KeyState({"rpm": 112.9}, {"rpm": 0.504})}
    reading = Reading(0.0, LimiterMode.MEMORY, {}, keys, [], teams={"t": spent})
    html = render(state(settings, Catalog(settings), reading))
    for table in ("deployments", "teams", "keys"):
        head = html.split(f'<table class="{table}">')[1].split("</tr>")[0]
        assert "Rate limits: what is left of each window" in head, table
        assert ("Budgets: what is left of each" in head) == (table != "deployments"), table
    assert "<b>112</b> of 120 requests per minute left, full again" in html
    assert "in 0.5 s</span>" in html
    assert "<b>$12.35</b> of $50.00 left this month, resets <span" in html
    assert ">in 9 d</span>" in html


def test_a_models_waiting_requests_add_up_and_the_key_stores_loss_shows() -> None:
    settings = settings_from(
        {
            "keys": [{"name": "k", "key": "sk-a"}],
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    busy = Activity(waiting={"m": 3}, waiting_on={"d": 1}, waiting_keys={"k": 3})
    view = state(settings, Catalog(settings), Reading(0.0, LimiterMode.MEMORY, {}, {}, [busy]))
    view["key_store"] = {
        "backend": "redis",
        "state": "current",
        "keys": 12,
        "losses_detected": 1,
        "last_loss": {
            "at": "2026-12-07T10:00:00Z",
            "reason": "wiped",
            "outcome": "restored",
            "written_back": 12,
            "keys_gone": 0,
        },
    }
    html = render(view)
    assert (
        "<b>3</b> requests waiting: <b>1</b> for a turn on a deployment below,"
        " <b class=any-waiting>2</b> for any deployment"
    ) in html
    assert '<td class="num waiting">1</td>' in html
    assert 'id="key-store" class="store warn"' in html
    assert "<b>lost its data 1 time</b>; last at 2026-12-07T10:00:00Z: wiped, restored" in html
    assert "(12 written back, 0 gone)" in html


def _report(
    period: str, rows: list[dict[str, Any]], days: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    current: dict[str, Any] = {
        "start": "2026-12-01T00:00:00Z",
        "end": "2027-01-01T00:00:00Z",
        "spend": rows,
    }
    if days is not None:
        current["days"] = days
    return {"period": period, "current": current, "previous": {"start": "", "spend": []}}


def test_the_spend_view_marks_estimates_and_escapes_names() -> None:
    rows = [
        {
            "key": "<a>",
            "team": "",
            "model": "m",
            "usd": 1.25,
            "input_tokens": 1000,
            "output_tokens": 200,
            "requests": 3,
            "estimated": 0,
        },
        {
            "key": "bob",
            "team": "t",
            "model": "m",
            "usd": 0.5,
            "input_tokens": 10,
            "output_tokens": 20,
            "requests": 2,
            "estimated": 1,
        },
    ]
    day = {
        "date": "2026-12-01",
        "usd": 1.75,
        "input_tokens": 1010,
        "output_tokens": 220,
        "requests": 5,
        "estimated": 1,
    }
    html = render_spend(
        {
            "day": _report("day", rows),
            "week": _report("week", rows),
            "month": _report("month", rows, [day]),
        },
        30,
    )
    assert "&lt;a&gt;" in html and "<a>" not in html
    assert '<tr data-key="bob">' in html and "(1 estimated)" in html
    assert '<b class="est" title="includes 1 estimated">&asymp; $1.75</b>' in html
    assert '<tr data-team="">' in html and "(no team)" in html
    # 31 days drawn, the first with a hatched bar; no script, nothing external.
    assert html.count("</text>") == 31 + 2
    assert re.search(r'<rect class="bar" data-day="2026-12-01"[^>]*fill="url\(#est\)"', html)
    assert "<script" not in html and "http://" not in html and "https://" not in html
