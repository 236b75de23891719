"""Coalescing the limiter's Redis calls: every script called within one turn of the event
loop goes out in one pipelined round trip.

Under load a proxy makes several limiter calls per loop turn (a key check, a reservation,
settlements of finished requests). Sent one by one, each pays a connection checkout, a
deadline, a write and a read; sent together they pay them once, and Redis reads them in
one go. A lone call still goes out at once: the flush is scheduled for the end of the
current turn, not after a delay.

Bookkeeping that nothing waits for (settlements: releasing a slot, correcting an
estimate) is submitted as *not urgent*: it lingers a few milliseconds for the next urgent
call (a reservation) and goes out in front of it, in the same round trip, so a request
costs one round trip, not two. A linger timer sends it on its own when no urgent call
comes; either way it runs before anything submitted after it.

A batch with several calls that are not urgent may be *merged* before it goes out
(``merge``, given by the backend that knows its scripts): several calls become one, and
each of them gets that call's result (or the batch's failure). The Redis backend merges
the key settlements of one key this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from proxy.limiter.base import StorageError

__all__ = ["Batcher"]

ScriptCall = tuple[str, list[str], list[str]]  # script name, keys, args
Runner = Callable[[list[ScriptCall]], Awaitable[list[Any]]]
# The batch's results (or its failure), handed over as soon as they are known.
Deliver = Callable[[list[Any] | BaseException], None]
# Sends a batch at once, without a task, when it can (connected): True if it did.
SendNow = Callable[[list[ScriptCall], Deliver], bool]
# The calls to send instead of a batch, and for each call of the batch the index of the
# call whose result is its own; None: send the batch as it is.
Merge = Callable[[list[ScriptCall]], tuple[list[ScriptCall], list[int]] | None]

LINGER = 0.005  # seconds a call that is not urgent may wait for company


class Batcher:
    def __init__(
        self,
        run: Runner,
        linger: float = LINGER,
        send_now: SendNow | None = None,
        merge: Merge | None = None,
    ) -> None:
        self._run = run
        self._send_now = send_now
        self._merge = merge
        self._linger = linger
        self._calls: list[ScriptCall] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._lingering = 0  # calls of this batch that are not urgent
        self._tasks: set[asyncio.Task[None]] = set()
        self._flush_soon = False  # a flush at the end of this turn is scheduled
        self._timer: asyncio.TimerHandle | None = None  # the lingering calls' flush

    @property
    def pending(self) -> int:
        """Calls waiting for the batch that takes them (lingering ones included)."""
        return len(self._calls)

    def submit(
        self, script: str, keys: list[str], args: list[str], *, urgent: bool = True
    ) -> asyncio.Future[Any]:
        """The result of ``script``, run with the other calls of this loop turn (or, not
        ``urgent``, with the next urgent one, at most ``linger`` seconds later)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.append((script, keys, args))
        self._futures.append(future)
        if urgent and not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush)
        elif not urgent:
            self._lingering += 1
            if not self._flush_soon and self._timer is None:
                self._timer = loop.call_later(self._linger, self._flush)
        return future

    async def drain(self) -> None:
        """Send what lingers now and wait for every batch in flight (each caller gets
        its result or failure): a shutdown closes the connection after them."""
        lingering = list(self._futures)
        self._flush()  # a task, if not sent at once, joins the ones in flight
        await asyncio.gather(*lingering, *self._tasks, return_exceptions=True)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush_soon = False
        calls, futures = self._calls, self._futures
        if not calls:
            return
        self._calls, self._futures = [], []
        deliver: Deliver
        # Only bookkeeping merges (settlements): not worth a look with fewer than two.
        merged = self._merge(calls) if self._lingering > 1 and self._merge is not None else None
        self._lingering = 0
        if merged is None:
            deliver = partial(_deliver, futures)
        else:
            calls, owners = merged
            deliver = partial(_deliver_merged, futures, owners)
        if self._send_now is not None and self._send_now(calls, deliver):
            return  # the results go straight to the futures: no task, no extra turn
        task = asyncio.ensure_future(self._send(calls, deliver))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, calls: list[ScriptCall], deliver: Deliver) -> None:
        try:
            results = await self._run(calls)
        except BaseException as exc:
            deliver(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        deliver(results)


def _deliver_merged(
    futures: list[asyncio.Future[Any]], owners: list[int], outcome: list[Any] | BaseException
) -> None:
    """A merged batch's results (or failure), each call getting its merged call's."""
    if isinstance(outcome, BaseException):
        _deliver(futures, outcome)
    else:
        _deliver(futures, [outcome[i] for i in owners])


def _deliver(futures: list[asyncio.Future[Any]], outcome: list[Any] | BaseException) -> None:
    if isinstance(outcome, BaseException):  # the batch failed as a whole: so does every call
        error = outcome if isinstance(outcome, StorageError) else StorageError(str(outcome))
        for future in futures:
            if not future.done():
                future.set_exception(error)
        return
    for future, result in zip(futures, outcome, strict=True):
        if future.done():
            continue  # its caller gave up (cancelled) meanwhile
        if isinstance(result, Exception):
            future.set_exception(StorageError(f"redis limiter: {result}"))
        else:
            future.set_result(result)
