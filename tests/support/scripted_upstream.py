"""A scripted raw upstream (raw_upstream.RawUpstream) served from its own thread and loop,
so that tests driving a real proxy (``ProxyInThread``) with synchronous clients (httpx,
the openai SDK) can put it behind the proxy.

    with ScriptedUpstream(answer) as upstream:
        config = {"models": [{"name": "m", "deployments": [{"base_url": upstream.url, ...}]}]}
"""

from __future__ import annotations

import asyncio
import threading

from support.raw_upstream import Answer, RawUpstream, SeenRequest

__all__ = ["ScriptedUpstream"]


class ScriptedUpstream:
    """``answer`` runs on the upstream's own loop, once per request."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._server: RawUpstream | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="scripted-upstream")

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url

    @property
    def requests(self) -> list[SeenRequest]:
        assert self._server is not None
        return self._server.requests

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with RawUpstream(self._answer) as server:
            self._server = server
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the scripted upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
