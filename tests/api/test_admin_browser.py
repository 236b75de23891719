"""Acceptance: the admin page in a real browser. Headless Chromium, sending the admin key
as a header (over the DevTools protocol: never in the URL), loads ``/admin`` from a
running proxy with a cooling deployment and a waiting request, and its rendered DOM shows
both; without the key it gets 401. A screenshot is kept under pytest's tmp path.

Skipped only when no Chromium is installed and ``CI`` is not set (``.ci/run`` installs it).
Chromium takes a few seconds to start on this machine; every step is bounded (``load``).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.admin import ADMIN, config, cooling_and_waiting, poll_state, shows_cooling_and_waiting
from support.browser import Page, find_chromium, load
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

BROWSER_TIMEOUT = 60.0  # seconds for one page load, Chromium's start included


@pytest.fixture
def chromium() -> str:
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    return path


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
