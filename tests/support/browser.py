"""A real headless Chromium driven over the DevTools protocol (aiohttp's websocket client,
no new dependency): load a page with extra request headers (the admin key stays out of
the URL), read its DOM and its text (what a reader sees) after scripts ran, keep a
screenshot of the whole page at a given width.

Every step is bounded: Chromium's start, the page's load, each command.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # the port it picks is written to DevToolsActivePort
)


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def required_chromium() -> str:
    """Chromium's path; the test is skipped without one, unless ``CI`` is set (then it
    fails: ``.ci/run`` installs it)."""
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    return path


WIDTH = 1200  # CSS pixels: the window's width, and the screenshot's
MAX_HEIGHT = 4000  # a screenshot's height at most (the page's top)


@dataclass
class Page:
    status: int  # the document's HTTP status
    dom: str  # document.documentElement.outerHTML once loaded
    seconds: float  # from starting Chromium to the DOM read
    text: str = ""  # document.body.innerText: the page's text as rendered


async def load(
    url: str,
    headers: dict[str, str],
    screenshot: Path | None = None,
    timeout: float = 60.0,
    chromium: str | None = None,
    script: str | None = None,
) -> Page:
    """Load ``url`` in a fresh headless Chromium sending ``headers`` with every request;
    ``script``: a JavaScript expression run in the page once loaded (a promise is awaited),
    as a user's clicks would, before the DOM is read."""
    binary = chromium or find_chromium()
    if binary is None:
        raise RuntimeError("chromium not found")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return await asyncio.wait_for(
                _drive(Path(profile), url, headers, screenshot, started, script), timeout
            )
        finally:
            _stop(process)


async def _drive(
    profile: Path,
    url: str,
    headers: dict[str, str],
    screenshot: Path | None,
    started: float,
    script: str | None,
) -> Page:
    port = await _debugging_port(profile)
    async with aiohttp.ClientSession() as session:
        target = await _page_target(session, port)
        async with session.ws_connect(target, max_msg_size=0) as ws:
            cdp = _Session(ws)
            await cdp.call("Network.enable")
            await cdp.call("Network.setExtraHTTPHeaders", {"headers": headers})
            await cdp.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": 800, "deviceScaleFactor": 1, "mobile": False},
            )
            await cdp.call("Page.enable")
            await cdp.call("Page.navigate", {"url": url})
            response = await cdp.event(
                "Network.responseReceived", lambda p: p.get("type") == "Document"
            )
            await cdp.event("Page.loadEventFired")
            if script is not None:
                # The page's own requests carry the headers its script sets, as after a
                # login prompt (the browser's Basic credentials never replace them).
                await cdp.call("Network.setExtraHTTPHeaders", {"headers": {}})
                ran = await cdp.call(
                    "Runtime.evaluate", {"expression": script, "awaitPromise": True}
                )
                if "exceptionDetails" in ran:
                    raise RuntimeError(f"the page's script failed: {ran['exceptionDetails']}")
            dom = await _value(cdp, "document.documentElement.outerHTML")
            text = await _value(cdp, "document.body ? document.body.innerText : ''")
            seconds = time.monotonic() - started
            if screenshot is not None:
                await _screenshot(cdp, screenshot)
            return Page(int(response["response"]["status"]), dom, seconds, text)


async def _value(cdp: _Session, expression: str) -> str:
    result = await cdp.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
    return str(result["result"]["value"])


async def _screenshot(cdp: _Session, path: Path) -> None:
    """The whole page (at most ``MAX_HEIGHT`` tall), ``WIDTH`` wide, as a PNG."""
    metrics = await cdp.call("Page.getLayoutMetrics")
    height = min(int(metrics["cssContentSize"]["height"]) + 1, MAX_HEIGHT)
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}
    shot = await cdp.call(
        "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


async def _debugging_port(profile: Path) -> int:
    marker = profile / "DevToolsActivePort"
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int(marker.read_text().splitlines()[0])
        await asyncio.sleep(0.05)


async def _page_target(session: aiohttp.ClientSession, port: int) -> str:
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}/json/list") as reply:
                for target in await reply.json():
                    if target.get("type") == "page":
                        return str(target["webSocketDebuggerUrl"])
        await asyncio.sleep(0.05)


class _Session:
    """Commands with ids; events kept until asked for."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        call_id = next(self.ids)
        command = {"id": call_id, "method": method, "params": params or {}}
        await self.ws.send_str(json.dumps(command))
        while True:
            message = await self._receive()
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    async def event(self, method: str, match: Any = None) -> dict[str, Any]:
        """The first event ``method`` (whose params ``match``), kept or still to come."""

        def wanted(message: dict[str, Any]) -> bool:
            return message.get("method") == method and (match is None or match(message["params"]))

        for i, message in enumerate(self.events):
            if wanted(message):
                del self.events[i]
                return dict(message["params"])
        while True:
            message = await self._receive()
            if wanted(message):
                return dict(message["params"])
            self.events.append(message)

    async def _receive(self) -> dict[str, Any]:
        message = await self.ws.receive()
        if message.type is not aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"DevTools connection ended: {message.type}")
        data: dict[str, Any] = json.loads(message.data)
        return data


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Chromium and its helper processes (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 15)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        process.wait(timeout=5)
