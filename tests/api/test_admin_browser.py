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
import json
import re
from collections.abc import Iterator
from pathlib import Path

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
    answers.push(document.getElementById('result').textContent);
  }
  document.body.dataset.answers = JSON.stringify(answers);
})()
"""


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
    script = _SUBMIT % {"admin": json.dumps(ADMIN_KEY), "steps": json.dumps(steps)}

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
    answers = json.loads(
        re.search(r'data-answers="([^"]*)"', page.dom).group(1).replace("&quot;", '"')  # type: ignore[union-attr]
    )
    created, rotated, revoked = answers
    assert created.startswith("201 ") and '"key":"sk-llmp-' in created
    assert rotated.startswith("200 ") and '"key":"sk-llmp-' in rotated
    assert revoked.startswith("204 ")
    assert forged.status_code == 401
    assert [k["name"] for k in listed] == ["team-a"]  # created, then revoked: gone
