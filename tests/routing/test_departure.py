"""``Departure``: a client leaving during an upstream call cancels the request's task,
once, and only while it is watched (no timing: the departure is told by hand)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proxy.request.call import Arrival, Call
from proxy.routing.dispatcher import Departure
from proxy.shapes.chat import CHAT


class Connection:
    """What the proxy's protocol offers: callbacks told when the client goes."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.waiting.append(callback)
        return lambda: self.waiting.remove(callback)

    def lost(self) -> None:
        for callback in list(self.waiting):
            callback()


def _call(connection: Connection) -> Call:
    return Call(Arrival("r", CHAT, 0.0, watch_departure=connection.watch))


def test_a_departure_cancels_the_call_and_is_taken_back_once_stopped() -> None:
    async def scenario() -> tuple[bool, int]:
        connection = Connection()
        departure = Departure(_call(connection))
        connection.lost()
        try:
            await asyncio.Event().wait()  # the upstream call, never answered
        except asyncio.CancelledError:
            left = departure.stop()
        task = asyncio.current_task()
        assert task is not None
        return left, task.cancelling()

    assert asyncio.run(scenario()) == (True, 0)


def test_once_stopped_a_departure_changes_nothing() -> None:
    async def scenario() -> bool:
        connection = Connection()
        departure = Departure(_call(connection))
        assert departure.stop() is False
        assert connection.waiting == []
        connection.lost()
        await asyncio.sleep(0)  # not cancelled: this returns
        return departure.left

    assert asyncio.run(scenario()) is False


def test_without_a_client_to_watch_nothing_is_watched() -> None:
    async def scenario() -> bool:
        return Departure(Call(Arrival("r", CHAT, 0.0))).stop()

    assert asyncio.run(scenario()) is False
