"""Acceptance: the admin page reads at a glance, in a real headless Chromium logged in as
a browser's login prompt would (Basic credentials, the admin key as password), on an
idle, a loaded and a saturated proxy; and its spend view on two replicas sharing Redis.

Each page is screenshot 1,200 px wide (``docs/admin-*.png`` when ``ADMIN_SCREENSHOTS=docs``:
``make admin-screenshots``; else under the test's temp dir). The checks read the page's
text from the browser's DOM and compare it with what ``/admin/state`` and
``/admin/spend`` answer. Skipped only when no Chromium is installed and ``CI`` is not set.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.admin import ADMIN, poll_state
from support.admin_scenes import (
    BASIC,
    config,
    pending,
    screenshot_dir,
    scripted,
    send,
)
from support.browser import Page, load, required_chromium
from support.proxy_server import ProxyInThread, settings_from
from support.scripted_upstream import ScriptedUpstream

from proxy.api.admin_format import count, dollars, number, per, unit
from proxy.money.spend import summed

BROWSER_TIMEOUT = 60.0  # seconds for one page load, Chromium's start included


@pytest.fixture
def chromium() -> str:
    return required_chromium()


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(scripted) as server:
        yield server


def text_of(html: str) -> str:
    """What a reader sees of a piece of the DOM: its text, spaces collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split()).replace(" ,", ",")


def row(dom: str, attribute: str) -> str:
    """The HTML of the table row ``<tr attribute ...>``."""
    match = re.search(rf"<tr {re.escape(attribute)}[^>]*>(.*?)</tr>", dom, re.S)
    assert match, f"no row {attribute}"
    return match.group(1)


def part(html: str, cls: str, name: str) -> str:
    """The text of ``<div class="cls" data-cls="name">`` (a window, a budget) in ``html``."""
    match = re.search(rf'<div class="{cls}" data-{cls}="{re.escape(name)}">(.*?)</div>', html)
    assert match, f"no {cls} {name}"
    return text_of(match.group(1))


def window_text(w: dict[str, Any]) -> str:
    """How the page begins a window of a key or a team (as much at once as its limit):
    "112 of 120 requests per minute left"."""
    limit = w["limit"]
    assert w["capacity"] == limit, w
    of = f"{number(limit)} {unit(w['kind'], limit)} {per(w['per_seconds'])}"
    return f"{count(w['remaining'])} of {of} left"


def deployment_window_text(w: dict[str, Any]) -> str:
    """How the page begins a deployment's window: as a key's when it holds its limit at
    once, else "0 of 1 request left, refilling 6 per minute" (its burst, refilling at
    its pace)."""
    limit, capacity = w["limit"], w["capacity"]
    if capacity == limit:
        return window_text(w)
    return f"{count(w['remaining'])} of {number(capacity)} {unit(w['kind'], capacity)} left"


def cell(row_html: str, cls: str) -> str:
    """The text of the row's ``<td class="num cls">``."""
    match = re.search(rf'<td class="num {cls}">(.*?)</td>', row_html, re.S)
    assert match, f"no {cls} cell"
    return text_of(match.group(1))


def slots_text(owner: dict[str, Any]) -> str:
    if owner["max_parallel"] is None:
        return "no limit"
    return f"{count(owner['slots_held'])} of {count(owner['max_parallel'])}"


def now_figures_match(dom: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Every deployment's and key's "now" cells (in flight, waiting, parallel slots) and
    every deployment's health and windows, on the page as ``/admin/state`` said both
    before and after the page was read (a figure that moved meanwhile is skipped: either
    could be shown). What was checked, as the page shows it."""
    checked: list[str] = []
    later_deployments = {d["id"]: d for m in after["models"] for d in m["deployments"]}
    for m in before["models"]:
        for d in m["deployments"]:
            same = later_deployments[d["id"]]
            html = row(dom, f'data-deployment="{d["id"]}"')
            if d["health"]["state"] == same["health"]["state"]:
                assert f'data-health="{d["health"]["state"]}"' in dom
            for field, cls in (("in_flight", "in-flight"), ("waiting", "waiting")):
                if d[field] == same[field]:
                    assert cell(html, cls) == count(d[field]), (d["id"], field, d[field])
                    checked.append(f"{d['id']} {field} {cell(html, cls)}")
            windows = {w["name"]: w for w in same["windows"]}
            for w in d["windows"]:
                if math.floor(windows[w["name"]]["remaining"] + 1e-9) != math.floor(
                    w["remaining"] + 1e-9
                ):
                    continue
                shown = part(html, "window", w["name"])
                assert shown.startswith(deployment_window_text(w)), (shown, w)
                checked.append(shown)
    later_keys = {k["name"]: k for k in after["keys"]}
    for k in before["keys"]:
        same, html = later_keys[k["name"]], row(dom, f'data-key="{k["name"]}"')
        for field, cls in (("in_flight", "in-flight"), ("waiting", "waiting")):
            if k[field] == same[field]:
                assert cell(html, cls) == count(k[field]), (k["name"], field)
                checked.append(f"{k['name']} {field} {cell(html, cls)}")
        if k["slots_held"] == same["slots_held"]:
            assert cell(html, "slots") == slots_text(k), k["name"]
            checked.append(f"{k['name']} slots {cell(html, 'slots')}")
    for t in before["teams"]:
        assert cell(row(dom, f'data-team="{t["name"]}"'), "slots") == slots_text(t)
    return checked


def model(view: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in view["models"] if m["name"] == name)
    return found


async def state(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    reply = await client.get(f"{url}/admin/state", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    view: dict[str, Any] = reply.json()
    return view


async def shoot(url: str, chromium: str, shot: Path) -> Page:
    """``url`` in Chromium with the page's login (Basic), its screenshot kept at ``shot``."""
    page = await load(url, BASIC, shot, BROWSER_TIMEOUT, chromium)
    assert page.status == 200, page.dom[:500]
    assert shot.read_bytes().startswith(b"\x89PNG")
    return page


@pytest.mark.slow
def test_an_idle_proxys_page_writes_each_figure_as_its_state_says(
    chromium: str, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """After some traffic, nothing under way: every window whose figure did not move
    between two reads of ``/admin/state`` around the page's load reads, on the page,
    "<floor(remaining)> of <limit> <unit> per <period> left"; every budget "<left> of
    <limit> left <period>"; the key store's status is shown."""
    shot = screenshot_dir(tmp_path) / "admin-idle.png"

    async def scenario(url: str) -> tuple[dict[str, Any], Page, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await send(client, url, "alice", "gpt-4o", 4)  # her 4 parallel slots
            answers += await send(client, url, "alice", "gpt-4o", 4)
            answers += await send(client, url, "bob", "gpt-4o", 3)
            answers += await send(client, url, "ci-bot", "mini", 1)
            assert [a.status_code for a in answers] == [200] * 12
            before = await state(client, url)
            page = await shoot(f"{url}/admin", chromium, shot)
            return before, page, await state(client, url)

    with ProxyInThread(settings_from(config(upstream.url))) as proxy:
        before, page, after = asyncio.run(scenario(proxy.url))

    dom = page.dom
    checked = []
    owners = [(k, f'data-key="{k["name"]}"') for k in before["keys"]]
    owners += [(t, f'data-team="{t["name"]}"') for t in before["teams"]]
    read_after = {o["name"]: o for o in after["keys"] + after["teams"]}
    for owner, attribute in owners:
        html = row(dom, attribute)
        later = {w["name"]: w for w in read_after[owner["name"]]["windows"]}
        for w in owner["windows"]:
            same = later[w["name"]]
            if math.floor(same["remaining"] + 1e-9) != math.floor(w["remaining"] + 1e-9):
                continue  # refilled by a whole one meanwhile: either figure could be shown
            shown = part(html, "window", w["name"])
            assert shown.startswith(window_text(w)), (shown, w)
            checked.append(shown)
        for b in owner["budgets"]:
            shown = part(html, "budget", b["name"])
            if b["kind"] == "usd":
                expected = f"{dollars(b['remaining'])} of {dollars(b['limit'])} left"
            else:
                expected = f"{count(b['remaining'])} of {count(b['limit'])} {unit(b['kind'])} left"
            assert shown.startswith(expected), (shown, b)
            checked.append(shown)
    checked += now_figures_match(dom, before, after)
    print("\n".join(checked))
    limiter = before["limiter"]
    assert f'<b id="mode">{limiter["mode"]}</b>' in dom
    replicas = limiter["replicas_reporting"]
    assert f"{count(replicas)} {'replica' if replicas == 1 else 'replicas'} reporting" in page.text
    # A day's thousand requests refill one every 86 s: alice's 8 are still taken.
    assert "992 of 1,000 requests per day left" in " ".join(checked)
    assert "$19.95 of $20.00 left today" in " ".join(checked)  # 8 x 1,200 in, 300 out
    # Nothing under way, and the key store (the admin API's) said to be read.
    assert '<b id="waiting">0</b>' in dom
    assert re.search(r'id="key-store" class="store" data-state="current"', dom)
    assert "no loss of its data detected" in page.text
    assert "Rate limits: what is left of each window" in page.text
    assert "Budgets: what is left of each" in page.text


def _waiting_adds_up(dom: str, name: str) -> tuple[int, int, int]:
    """A model's waiting requests on the page: (all, on its deployments' turns, for any
    deployment), from its summary line and its deployments' rows."""
    section = re.search(rf'<h2 id="model-{name}">.*?</table>', dom, re.S)
    assert section, name
    html = section.group(0)
    total = re.search(r'model-waiting" data-waiting="(\d+)"', html)
    assert total, html
    anywhere = re.search(r'<b class="any-waiting">([\d,]+)</b>', html)
    rows = [int(n) for n in re.findall(r'<td class="num waiting">(\d+)</td>', html)]
    return int(total.group(1)), sum(rows), int(anywhere.group(1)) if anywhere else 0


@pytest.mark.slow
def test_a_loaded_proxys_page_adds_its_waiting_requests_up(
    chromium: str, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """Requests held upstream (in flight) and waiting for turns on a model paced at 6 a
    minute: the ones holding a turn wait on their deployment, the ones after them (a
    turn farther than the lookahead) wait for any deployment; the model's count is
    their sum, on the page as in ``/admin/state``."""
    shot = screenshot_dir(tmp_path) / "admin-loaded.png"

    def loaded(view: dict[str, Any]) -> bool:
        mini = model(view, "mini")
        [d] = mini["deployments"]
        alice = next(k for k in view["keys"] if k["name"] == "alice")
        return bool(
            alice["in_flight"] == 3
            and d["in_flight"] == 1
            and d["waiting"] >= 1
            and mini["waiting_for_any_deployment"] >= 1
        )

    async def scenario(url: str) -> tuple[dict[str, Any], Page, dict[str, Any]]:
        async with (
            httpx.AsyncClient(timeout=120) as client,
            pending(client, url, "alice", "gpt-4o", 3),
            pending(client, url, "ci-bot", "mini", 4),
        ):
            view = await poll_state(url, loaded, timeout=30.0)
            page = await shoot(f"{url}/admin", chromium, shot)
            after = await state(client, url)
        return view, page, after

    with ProxyInThread(settings_from(config(upstream.url))) as proxy:
        view, page, after = asyncio.run(scenario(proxy.url))

    # In flight, waiting and slots on every row, as the state says (what did not move).
    checked = now_figures_match(page.dom, view, after)
    print("\n".join(checked))
    assert "alice in_flight 3" in checked or view["keys"] != after["keys"]

    mini = model(view, "mini")
    [d] = mini["deployments"]
    assert mini["waiting"] == d["waiting"] + mini["waiting_for_any_deployment"]
    total, on_turns, anywhere = _waiting_adds_up(page.dom, "mini")
    assert total == on_turns + anywhere and total >= 2, (total, on_turns, anywhere)
    assert "for any deployment" in page.text
    gpt = _waiting_adds_up(page.dom, "gpt-4o")
    assert gpt[0] == gpt[1] + gpt[2]
    # The deployments' in-flight cells are whole numbers, and sum to what is under way.
    in_flight = [int(n) for n in re.findall(r'<td class="num in-flight">(\d+)</td>', page.dom)]
    assert sum(in_flight) >= 4


@pytest.mark.slow
def test_a_saturated_proxys_page_shows_spent_windows_and_its_queue(
    chromium: str, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """A key past its minute's five requests (429 ``key_rpm``) and a model whose queue is
    full (429 ``queue_full``): the page shows the key's window spent ("0 of 5 requests
    per minute left") and the requests waiting, adding up."""
    shot = screenshot_dir(tmp_path) / "admin-saturated.png"

    def saturated(view: dict[str, Any]) -> bool:
        return bool(model(view, "mini")["waiting"] == 6)

    async def scenario(url: str) -> tuple[list[str], Page]:
        async with httpx.AsyncClient(timeout=120) as client:
            answers = await send(client, url, "bob", "gpt-4o", 8)
            async with pending(client, url, "ci-bot", "mini", 16) as queued:
                await poll_state(url, saturated, timeout=30.0)
                page = await shoot(f"{url}/admin", chromium, shot)
                answers += [t.result() for t in queued if t.done()]
        return sorted(_outcome(a) for a in answers), page

    with ProxyInThread(settings_from(config(upstream.url, max_queue=6))) as proxy:
        outcomes, page = asyncio.run(scenario(proxy.url))

    # Bob's three past his minute; the model's nine past its queue of six (one in flight).
    assert outcomes == ["200"] * 5 + ["429 key_rpm"] * 3 + ["429 queue_full"] * 9, outcomes
    rpm = part(row(page.dom, 'data-key="bob"'), "window", "rpm")
    assert rpm.startswith("0 of 5 requests per minute left, full again in "), rpm
    total, on_turns, anywhere = _waiting_adds_up(page.dom, "mini")
    assert (total, on_turns + anywhere) == (6, 6)
    assert '<b id="waiting">6</b>' in page.dom


def _outcome(answer: httpx.Response) -> str:
    if answer.status_code == 200:
        return "200"
    return f"{answer.status_code} {answer.json()['error']['code']}"


# --- the spend view ----------------------------------------------------------------------


def period_cell(row_html: str, period: str) -> str:
    """The text of a spend table row's cell for ``period`` (day, week, month)."""
    match = re.search(rf'<td class="num" data-period="{period}">(.*?)</td>', row_html, re.S)
    assert match, f"no {period} cell"
    return text_of(match.group(1))


def _spend(url: str, headers: dict[str, str], **query: str) -> httpx.Response:
    return httpx.get(f"{url}/admin/spend", params=query, headers=headers, timeout=10)


def _reported(url: str, requests: int, timeout: float = 15.0) -> dict[str, Any]:
    """The month's report once it counts ``requests`` (each replica writes once a second)."""
    until = time.monotonic() + timeout
    while True:
        document: dict[str, Any] = _spend(url, ADMIN, by_day="true").json()
        if summed(document["current"]["spend"])["requests"] >= requests:
            return document
        assert time.monotonic() < until, f"the report never counted {requests}: {document}"
        time.sleep(0.1)


@pytest.mark.slow
def test_the_spend_view_shows_both_replicas_spend_to_the_pages_login(
    chromium: str, upstream: ScriptedUpstream, redis_url: str, tmp_path: Path
) -> None:
    """Two replicas sharing Redis, spend made on both (one answer without its usage: an
    estimate). ``/admin/spend`` takes the page's Basic credentials as it takes the
    bearer admin key (wrong ones: 401, and the login prompt asked for); the spend view,
    opened with them on either replica, shows both replicas' spend as the report says,
    the estimate marked."""
    shot = screenshot_dir(tmp_path) / "admin-spend.png"
    settings = settings_from(config(upstream.url, redis_url))

    async def traffic(one: str, other: str) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await send(client, one, "alice", "gpt-4o", 3)
            answers += await send(client, other, "bob", "gpt-4o", 2)
            answers += await send(client, other, "bob", "gpt-4o", 1, user="no-usage")
            answers += await send(client, other, "ci-bot", "mini", 1)
            assert [a.status_code for a in answers] == [200] * 7

    with ProxyInThread(settings) as one, ProxyInThread(settings) as other:
        asyncio.run(traffic(one.url, other.url))
        document = _reported(one.url, 7)
        periods = {p: _spend(other.url, ADMIN, period=p).json() for p in ("day", "week", "month")}
        by_bearer = _spend(other.url, ADMIN)
        by_basic = _spend(other.url, BASIC)
        csv = _spend(other.url, BASIC, format="csv")
        wrong = _spend(other.url, {"authorization": "Basic YWRtaW46d3Jvbmc="})  # admin:wrong
        page = asyncio.run(shoot(f"{one.url}/admin?view=spend", chromium, shot))

    assert by_basic.status_code == by_bearer.status_code == 200
    assert by_basic.json()["current"] == by_bearer.json()["current"]
    assert csv.status_code == 200 and csv.text.startswith("period_start,")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_admin_key"
    assert wrong.headers["www-authenticate"].startswith('Basic realm="llm-proxy admin"')

    rows = document["current"]["spend"]
    assert {(r["key"], r["model"]) for r in rows} == {
        ("alice", "gpt-4o"),
        ("bob", "gpt-4o"),
        ("ci-bot", "mini"),
    }
    month = summed(rows)
    assert (month["requests"], month["estimated"]) == (7, 1)
    [today] = [d for d in document["current"]["days"] if d["requests"]]
    assert (today["requests"], today["usd"]) == (7, month["usd"])

    dom = page.dom
    summary = text_of(row(dom, 'data-period="month"'))
    assert f"≈ {dollars(month['usd'])}" in summary and " 7 " in f" {summary} "
    bob = [r for r in rows if r["key"] == "bob"]
    cell = text_of(row(dom, 'data-key="bob"'))
    assert f"≈ {dollars(summed(bob)['usd'])}" in cell and "3 requests (1 estimated)" in cell
    alice = text_of(row(dom, 'data-key="alice"'))
    assert f"{dollars(3 * 0.006)}" in alice and "≈" not in alice
    assert "research" in text_of(row(dom, 'data-team="research"'))
    day = text_of(row(dom, f'data-day="{today["date"]}"'))
    assert day.startswith(f"{today['date']} ≈ {dollars(today['usd'])} 7 ")
    assert re.search(rf'<rect class="bar" data-day="{today["date"]}"[^>]*fill="url\(#est\)"', dom)
    assert "<script" not in dom and "http://" not in dom.split("<body>")[1]

    # Today, this week and this month, in total and by key, team and model: each figure
    # the report's for that period.
    for period, report in periods.items():
        spend = report["current"]["spend"]
        total = summed(spend)
        assert total["requests"] == 7, (period, total)
        summary = text_of(row(dom, f'data-period="{period}"'))
        assert f"≈ {dollars(total['usd'])} 7 " in summary, (period, summary)
        for field in ("key", "team", "model"):
            for name in {r[field] for r in spend}:
                sums = summed([r for r in spend if r[field] == name])
                shown = period_cell(row(dom, f'data-{field}="{name}"'), period)
                assert dollars(sums["usd"]) in shown, (period, field, name, shown)
                assert shown.startswith("≈") == bool(sums["estimated"]), shown
                assert f"{sums['requests']} request" in shown, (period, field, name, shown)
    assert {"gpt-4o", "mini"} <= {r["model"] for r in periods["day"]["current"]["spend"]}


def test_the_spend_report_answers_the_pages_login_and_refuses_others(
    upstream: ScriptedUpstream,
) -> None:
    with ProxyInThread(settings_from(config(upstream.url))) as proxy:
        assert _spend(proxy.url, BASIC).status_code == 200
        assert _spend(proxy.url, BASIC, period="day", by_day="true").json()["current"]["days"]
        for headers in (
            {},
            {"authorization": "Basic YWRtaW46d3Jvbmc="},
            {"authorization": "Bearer x"},
        ):
            refused = _spend(proxy.url, headers)
            assert refused.status_code == 401, headers
        assert _spend(proxy.url, ADMIN, by_day="yes").status_code == 400
        # The key API stays bearer-only: the page's login drives no write (CSRF).
        assert httpx.get(f"{proxy.url}/admin/keys", headers=BASIC).status_code == 401
