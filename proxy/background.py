"""Bookkeeping off the critical path: tasks that must finish but nobody awaits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

__all__ = ["Background", "stop"]

logger = logging.getLogger("proxy.background")


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, work: Awaitable[None]) -> asyncio.Task[None]:
        """Start ``work``; keep a reference so it is neither collected nor lost. The task
        is returned for a caller that must know when it is done (it never raises)."""
        task = asyncio.ensure_future(self._guard(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _guard(work: Awaitable[None]) -> None:
        try:
            await work
        except Exception:  # bookkeeping must never take the process down
            logger.warning("background bookkeeping failed", exc_info=True)

    async def drain(self) -> None:
        """Wait for everything pending (at shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel a long-running task (a loop: polling, watching, heartbeats) and wait until
    it has ended; None: there is none."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
