"""Reload when the config file changes (``server.watch_config``): for a mounted
Kubernetes ConfigMap, which the kubelet updates in place by swapping a symlink
(``..data``) to a new directory, so no signal reaches the process.

One task per process, off the request path: every ``watch_config`` seconds a ``stat`` of
the path (followed through its symlinks, in a thread: a stalled volume must not stall the
loop). A different file (device, inode, mtime, size) reloads this process through its
``Reloader``, exactly as SIGHUP does; under ``--workers N`` each worker watches and
reloads itself. A missing file (between the steps of a swap, or deleted) changes nothing.
The reference is the file as it was just *before* the running config was read from it
(``seen``), so a swap during start-up is reloaded, never missed (at worst, once for
nothing).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from proxy.background import stop

__all__ = ["ChangeDetector", "ConfigWatcher", "FileSignature", "file_signature"]

logger = logging.getLogger("proxy.reload")

# (device, inode, mtime in ns, size) of the file a path leads to; None: nothing there.
FileSignature = tuple[int, int, int, int] | None


def file_signature(path: str) -> FileSignature:
    try:
        found = os.stat(path)  # follows symlinks: a ConfigMap's swap changes the inode
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)


class ChangeDetector:
    """Whether a file seen now differs from the one last seen. *Pure*."""

    def __init__(self, first: FileSignature) -> None:
        self._seen = first

    def changed(self, now: FileSignature) -> bool:
        if now is None or now == self._seen:
            return False  # missing: keep the config in force, compare with it when back
        self._seen = now
        return True


class ConfigWatcher:
    """Calls ``reload`` each time the file at ``path`` is found changed."""

    def __init__(
        self,
        path: str,
        seen: FileSignature,
        interval: float,
        reload: Callable[[], Awaitable[object]],
        *,
        signature: Callable[[str], FileSignature] = file_signature,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.path = path
        self._seen = seen
        self.interval = interval
        self._reload = reload
        self._signature = signature
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="config-watch")

    async def _look(self) -> FileSignature:
        return await asyncio.to_thread(self._signature, self.path)

    async def _watch(self) -> None:
        detector = ChangeDetector(self._seen)
        while True:
            await self._sleep(self.interval)
            if not detector.changed(await self._look()):
                continue
            logger.info("config file %s changed: reloading", self.path)
            try:
                await self._reload()  # counts itself, success or failure, and logs why
            except Exception:  # keep watching: the next change may be a good file
                logger.exception("config reload after a file change failed")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop(task)
