"""Acceptance: the admin page in a real browser. Headless Chromium, sending the admin key
as a header (over the DevTools protocol: never in the URL), loads ``/admin`` from a
running proxy with a cooling deployment and a waiting request, and its rendered DOM shows
both; without the key it gets 401. A screenshot is kept under pytest's tmp path.

Skipped only when no Chromium is installed and ``CI`` is not set (``.ci/run`` installs it).
Chromium takes a few seconds to start on this machine; every step is bounded (``load``).
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.admin import (
    ADMIN,
    ADMIN_KEY,
    config,
    cooling_and_waiting,
    poll_state,
    shows_cooling_and_waiting,
)
from support.browser import Page, load, required_chromium
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

BROWSER_TIMEOUT = 60.0  # seconds for one page load, Chromium's start included


@pytest.fixture
def chromium() -> str:
    return required_chromium()


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _cell(dom: str, row: str, cell: str) -> str:
    """The text of ``<td class="cell">`` in the table row ``row`` (a data attribute)."""
    match = re.search(rf"<tr {row}[^>]*>.*?<td class=\"num {cell}\">(.*?)</td>", dom, re.S)
    assert match, f"no {cell} in the row {row}"
    return match.group(1)


@pytest.mark.slow
def test_the_admin_page_in_a_browser_shows_cooling_and_waiting(
    chromium: str, upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    screenshot = tmp_path / "admin.png"

    async def scenario(url: str) -> tuple[Page, Page]:
        async with cooling_and_waiting(url):
            await poll_state(url, shows_cooling_and_waiting)
            page = await load(f"{url}/admin", ADMIN, screenshot, BROWSER_TIMEOUT, chromium)
            refused = await load(f"{url}/admin", {}, None, BROWSER_TIMEOUT, chromium)
        return page, refused

    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        page, refused = asyncio.run(scenario(proxy.url))

    print(f"chromium loaded /admin in {page.seconds:.1f} s; screenshot: {screenshot}")
    assert page.status == 200
    dom = page.dom
    assert re.search(r'data-deployment="broken" data-health="cooling"', dom)
    assert re.search(r'class="state cooling">cooling</span><br>cooldown ends <span', dom)
    assert _cell(dom, 'data-deployment="paced"', "waiting") == "1"
    assert _cell(dom, 'data-key="team-a"', "waiting") == "1"
    assert re.search(r'<b id="waiting">1</b>', dom)
    assert screenshot.read_bytes().startswith(b"\x89PNG")

    # Without the key: 401, and the browser asks for a login (HTTP Basic) instead of
    # rendering the error: nothing of the state reaches the page.
    assert refused.status == 401
    assert "data-deployment" not in refused.dom


_RESULT = "document.getElementById('result').textContent"


def _script(steps: list[list[Any]], seen: str = _RESULT) -> str:
    """The user's ``steps`` (form, fields) on the key manager; after each, ``seen`` (a
    JavaScript expression) is kept in the page (``_answers``)."""
    return _SUBMIT % {"admin": json.dumps(ADMIN_KEY), "steps": json.dumps(steps), "seen": seen}


def _answers(page: Page) -> list[Any]:
    found = re.search(r'data-answers="([^"]*)"', page.dom)
    assert found, page.dom[-2000:]
    return list(json.loads(html.unescape(found.group(1))))


# What a user does on the key manager: type the admin key, fill a form, press its button,
# and wait for the page's answer. One form a step; the answer is in <output id="result">.
_SUBMIT = """
(async () => {
  const set = (form, name, value) => {
    document.querySelector(`#${form} [name=${name}]`).value = value;
  };
  const done = () => new Promise((resolve) => {
    const seen = document.getElementById('result');
    const check = () => seen.dataset.status ? resolve() : setTimeout(check, 20);
    check();
  });
  const answers = [];
  document.getElementById('admin-key').value = %(admin)s;
  for (const [form, fields] of %(steps)s) {
    delete document.getElementById('result').dataset.status;
    for (const [name, value] of Object.entries(fields)) set(form, name, value);
    document.querySelector(`#${form} button`).click();
    await done();
    answers.push(%(seen)s);
  }
  document.body.dataset.answers = JSON.stringify(answers);
})()
"""


@pytest.mark.slow
def test_the_key_manager_creates_rotates_and_revokes_from_the_browser(
    chromium: str, upstream: FakeUpstreamHandle
) -> None:
    """The page is opened with the admin key as a Basic password (what a browser's login
    prompt sends); its forms send the key typed into the page as a bearer header, which
    the API needs: a Basic credential alone is refused there (no ambient authority for a
    forged cross-site post)."""
    basic = "Basic " + base64.b64encode(f"admin:{ADMIN_KEY}".encode()).decode()
    steps = [
        ["create", {"name": "from-browser", "rpm": "5"}],
        ["rotate", {"target": "from-browser", "grace": "0s"}],
        ["revoke", {"target": "from-browser"}],
    ]
    script = _script(steps)

    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        page = asyncio.run(
            load(
                f"{proxy.url}/admin/key-manager",
                {"authorization": basic},
                None,
                BROWSER_TIMEOUT,
                chromium,
                script=script,
            )
        )
        forged = httpx.post(
            f"{proxy.url}/admin/keys", json={"name": "forged"}, headers={"authorization": basic}
        )
        listed = httpx.get(f"{proxy.url}/admin/keys", headers=ADMIN).json()["keys"]

    assert page.status == 200
    created, rotated, revoked = _answers(page)
    assert created.startswith("201 ") and '"key":"sk-llmp-' in created
    assert rotated.startswith("200 ") and '"key":"sk-llmp-' in rotated
    assert revoked.startswith("204 ")
    assert forged.status_code == 401
    assert [k["name"] for k in listed] == ["team-a"]  # created, then revoked: gone


@pytest.mark.slow
def test_the_key_manager_gives_keys_a_team_windows_budgets_and_expiry_and_manages_teams(
    chromium: str, upstream: FakeUpstreamHandle, redis_url: str
) -> None:
    """The teams section: a team created, changed and deleted from the page (refused while
    a key names it); a key given that team (chosen among the known ones, the new one
    included), windows, budgets (and their edge) and an expiry from its forms. After each
    step the page's answer and its teams table are kept. Two replicas share the Redis:
    what the page did on one, the other's API lists."""
    settings = config(upstream.base_url, redis_url)
    settings["teams"] = [{"name": "research", "rpm": 50}]
    steps = [
        [
            "team-create",
            {"name": "squad", "rpm": "2", "budgets": '[{"usd": 5, "period": "month"}]'},
        ],
        [
            "create",
            {
                "name": "member",
                "team": "squad",
                "limits": '[{"requests": 100, "per": "1h"}]',
                "budgets": '[{"tokens": 1000, "period": "day"}]',
                "budget_edge": "clamp",
                "expires_at": "2030-01-15T12:00",
            },
        ],
        ["team-edit", {"target": "squad", "rpm": "9", "limits": '[{"tokens": 500, "per": "1m"}]'}],
        ["team-delete", {"target": "squad"}],
        ["edit", {"target": "member", "team": "-", "rpm": "4"}],
        ["team-delete", {"target": "squad"}],
        ["create", {"name": "broken", "limits": "not json"}],
    ]
    rows = "[...document.querySelectorAll('#team-rows tr')].map(r => r.textContent)"
    choices = "[...document.querySelectorAll('#create [name=team] option')].map(o => o.value)"
    script = _script(steps, seen=f"[{_RESULT}, {rows}, {choices}]")

    with (
        ProxyInThread(settings_from(settings)) as proxy,
        ProxyInThread(settings_from(settings)) as other,
    ):
        page = asyncio.run(
            load(f"{proxy.url}/admin/key-manager", ADMIN, None, BROWSER_TIMEOUT, chromium, script)
        )

        def seen_by_other() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
            keys = httpx.get(f"{other.url}/admin/keys", headers=ADMIN).json()["keys"]
            teams = httpx.get(f"{other.url}/admin/teams", headers=ADMIN).json()["teams"]
            member = next((k for k in keys if k["name"] == "member"), None)
            done = member is not None and member.get("rpm") == 4 and len(teams) == 1
            return (member, teams) if done and member is not None else None

        wait_until(seen_by_other, timeout=5, what="the page's changes on the other replica")
        member, teams = seen_by_other() or ({}, [])

    assert page.status == 200
    answers = _answers(page)
    results = [answer[0] for answer in answers]
    assert results[0].startswith("201 ") and '"source":"api"' in results[0]
    assert answers[0][1] == ["researchconfigrpm 50", "squadapirpm 2usd 5/month"]
    assert answers[0][2] == ["", "research", "squad"]  # the new team offered to keys
    assert results[1].startswith("201 ") and '"team":"squad"' in results[1]
    assert results[2].startswith("200 ")
    assert answers[2][1][1] == "squadapirpm 9, tokens 500/1musd 5/month"
    assert results[3].startswith("409 ") and "team_in_use" in results[3] and "member" in results[3]
    assert results[4].startswith("200 ") and '"team"' not in results[4]
    assert results[5].startswith("204 ")
    assert answers[5][1] == ["researchconfigrpm 50"] and answers[5][2] == ["", "research"]
    assert results[6].startswith("0 'limits' is not JSON")
    assert [t["name"] for t in teams] == ["research"]
    assert member["rpm"] == 4 and "team" not in member
    assert member["limits"] == [{"requests": 100, "per": "1h"}]
    assert member["budgets"] == [{"tokens": 1000, "period": "day"}]
    assert member["budget_edge"] == "clamp"
    assert member["expires_at"].startswith("2030-01-1") and not member["expired"]
