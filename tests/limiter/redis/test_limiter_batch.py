"""The Redis backend's batcher: the calls of one loop turn share a round trip, and
bookkeeping nobody waits for rides along with the next urgent call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.limiter.base import StorageError
from proxy.limiter.redis.batch import Batcher, Deliver, ScriptCall


class Recorder:
    """A runner that records every batch and answers each call with its script name."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail

    async def __call__(self, calls: list[ScriptCall]) -> list[Any]:
        self.batches.append([name for name, _, _ in calls])
        if self.fail is not None:
            raise self.fail
        return [ValueError("script error") if name == "bad" else name for name, _, _ in calls]


async def test_calls_of_one_loop_turn_go_out_together_in_order() -> None:
    run = Recorder()
    batcher = Batcher(run)
    results = await asyncio.gather(*(batcher.submit(name, [], []) for name in "abc"))
    assert results == ["a", "b", "c"]
    assert run.batches == [["a", "b", "c"]]


async def test_a_call_that_is_not_urgent_rides_with_the_next_urgent_one_in_front() -> None:
    run = Recorder()
    batcher = Batcher(run, linger=3600)  # its own timer would never fire in this test
    settled = batcher.submit("release", [], [], urgent=False)
    await asyncio.sleep(0)  # turns pass: it still waits for company
    await asyncio.sleep(0)
    assert run.batches == [] and not settled.done()
    reserved = await batcher.submit("reserve", [], [])
    assert (await settled, reserved) == ("release", "reserve")
    assert run.batches == [["release", "reserve"]]


async def test_a_lone_call_that_is_not_urgent_goes_out_after_its_linger() -> None:
    run = Recorder()
    batcher = Batcher(run, linger=0.001)
    assert await batcher.submit("release", [], [], urgent=False) == "release"
    assert run.batches == [["release"]]


async def test_a_failed_round_trip_fails_every_call_as_a_storage_error() -> None:
    batcher = Batcher(Recorder(fail=ConnectionError("gone")))
    calls = [batcher.submit("a", [], []), batcher.submit("b", [], [], urgent=False)]
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        assert isinstance(outcome, StorageError)


async def test_one_failing_script_fails_only_its_own_call() -> None:
    batcher = Batcher(Recorder())
    good, bad = batcher.submit("a", [], []), batcher.submit("bad", [], [])
    assert await good == "a"
    with pytest.raises(StorageError, match="script error"):
        await bad


async def test_a_caller_that_gave_up_does_not_disturb_the_others() -> None:
    batcher = Batcher(Recorder())
    gone, kept = batcher.submit("a", [], []), batcher.submit("b", [], [])
    gone.cancel()
    assert await kept == "b"


async def test_a_sender_that_can_send_at_once_answers_without_the_runner() -> None:
    run = Recorder()
    sent: list[list[str]] = []

    def send_now(calls: list[ScriptCall], deliver: Deliver) -> bool:
        sent.append([name for name, _, _ in calls])
        asyncio.get_running_loop().call_soon(deliver, [f"{name}!" for name, _, _ in calls])
        return True

    batcher = Batcher(run, send_now=send_now)
    assert await asyncio.gather(batcher.submit("a", [], []), batcher.submit("b", [], [])) == [
        "a!",
        "b!",
    ]
    assert sent == [["a", "b"]] and run.batches == []


async def test_a_sender_that_cannot_send_now_leaves_the_batch_to_the_runner() -> None:
    run = Recorder()
    batcher = Batcher(run, send_now=lambda calls, deliver: False)
    assert await batcher.submit("a", [], []) == "a"
    assert run.batches == [["a"]]


async def test_a_failure_handed_over_by_the_sender_fails_every_call() -> None:
    def send_now(calls: list[ScriptCall], deliver: Deliver) -> bool:
        deliver(ConnectionError("lost"))
        return True

    batcher = Batcher(Recorder(), send_now=send_now)
    calls = [batcher.submit("a", [], []), batcher.submit("b", [], [])]
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        assert isinstance(outcome, StorageError)


def merge_bs(calls: list[ScriptCall]) -> tuple[list[ScriptCall], list[int]] | None:
    """Every "b" of a batch as one "B" in place of the first."""
    out: list[ScriptCall] = []
    owners: list[int] = []
    first_b = -1
    for name, keys, args in calls:
        if name == "b" and first_b >= 0:
            owners.append(first_b)
            continue
        if name == "b":
            first_b = len(out)
            name = "B"
        owners.append(len(out))
        out.append((name, keys, args))
    return (out, owners) if len(out) < len(calls) else None


async def test_merged_calls_each_get_their_merged_calls_result() -> None:
    run = Recorder()
    batcher = Batcher(run, linger=3600, merge=merge_bs)
    lingering = [batcher.submit("b", [], [], urgent=False) for _ in range(3)]
    results = await asyncio.gather(
        *lingering, batcher.submit("a", [], []), batcher.submit("b", [], [])
    )
    assert results == ["B", "B", "B", "a", "B"]
    assert run.batches == [["B", "a"]]
    # Nothing to merge: the batch goes as it is.
    assert await asyncio.gather(batcher.submit("a", [], []), batcher.submit("c", [], [])) == [
        "a",
        "c",
    ]
    assert run.batches[-1] == ["a", "c"]


async def test_merged_calls_through_a_sender_that_sends_at_once() -> None:
    def send_now(calls: list[ScriptCall], deliver: Deliver) -> bool:
        asyncio.get_running_loop().call_soon(deliver, [f"{name}!" for name, _, _ in calls])
        return True

    batcher = Batcher(Recorder(), send_now=send_now, merge=merge_bs)
    b1, b2 = (batcher.submit("b", [], [], urgent=False) for _ in range(2))
    assert await asyncio.gather(b1, batcher.submit("a", [], []), b2) == ["B!", "a!", "B!"]


async def test_a_batch_without_two_calls_that_are_not_urgent_is_not_offered_to_merge() -> None:
    offered: list[list[str]] = []

    def merge(calls: list[ScriptCall]) -> tuple[list[ScriptCall], list[int]] | None:
        offered.append([name for name, _, _ in calls])
        return merge_bs(calls)

    run = Recorder()
    batcher = Batcher(run, linger=3600, merge=merge)
    assert await asyncio.gather(batcher.submit("b", [], []), batcher.submit("b", [], [])) == [
        "b",
        "b",
    ]
    lingering = batcher.submit("b", [], [], urgent=False)
    assert await asyncio.gather(lingering, batcher.submit("b", [], [])) == ["b", "b"]
    assert offered == [] and run.batches == [["b", "b"], ["b", "b"]]


async def test_a_failed_merged_batch_fails_every_merged_call_as_a_storage_error() -> None:
    batcher = Batcher(Recorder(fail=ConnectionError("gone")), linger=3600, merge=merge_bs)
    calls = [batcher.submit("b", [], [], urgent=False) for _ in range(3)]
    calls.append(batcher.submit("a", [], []))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(outcome, StorageError) for outcome in outcomes)


async def test_merged_lingering_calls_still_go_out_after_their_linger() -> None:
    run = Recorder()
    batcher = Batcher(run, linger=0.001, merge=merge_bs)
    lingering = [batcher.submit("b", [], [], urgent=False) for _ in range(2)]
    assert await asyncio.gather(*lingering) == ["B", "B"]
    assert run.batches == [["B"]]
