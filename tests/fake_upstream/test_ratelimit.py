"""The sliding-window log and the header formats, with an explicit clock (no sleeps)."""

from __future__ import annotations

import pytest

from proxy.fake_upstream import SlidingWindowLog, format_duration
from proxy.fake_upstream.ratelimit import ceil_millis, ceil_seconds


def accept(log: SlidingWindowLog, now: float, cost: int, rpm: int | None, tpm: int | None) -> bool:
    if log.check(now, cost, rpm, tpm) is not None:
        return False
    log.add(now, cost)
    return True


def test_requests_slide_out_exactly_one_window_later() -> None:
    log = SlidingWindowLog(window=10)
    assert [accept(log, t, 1, 3, None) for t in (0, 1, 2)] == [True] * 3
    rejection = log.check(9.9, 1, 3, None)
    assert rejection is not None
    assert rejection.kind == "requests"
    assert (rejection.limit, rejection.used, rejection.requested) == (3, 3, 1)
    assert rejection.retry_after == pytest.approx(0.1)
    assert accept(log, 10.0, 1, 3, None)  # the request of t=0 left the window
    assert not accept(log, 10.5, 1, 3, None)
    assert accept(log, 11.0, 1, 3, None)
    assert log.peak == 3


def test_rejections_consume_nothing() -> None:
    log = SlidingWindowLog(window=1)
    assert accept(log, 0.0, 1, 1, None)
    for step in range(1, 100):
        assert not accept(log, step / 100, 1, 1, None)
    assert accept(log, 1.0, 1, 1, None)


def test_every_window_span_holds_at_most_the_limit() -> None:
    log = SlidingWindowLog(window=1)
    accepted = [t / 1000 for t in range(0, 5000, 7) if accept(log, t / 1000, 1, 10, None)]
    for i, start in enumerate(accepted):
        inside = [t for t in accepted[i:] if t < start + 1]
        assert len(inside) <= 10
    assert len(accepted) >= 50  # and the budget is used: 10 per second for 5 s
    assert log.peak == 10


def test_tokens_wait_for_enough_old_entries_to_expire() -> None:
    log = SlidingWindowLog(window=60)
    assert accept(log, 0, 40, None, 100)
    assert accept(log, 1, 40, None, 100)
    rejection = log.check(2, 40, None, 100)
    assert rejection is not None
    assert (rejection.kind, rejection.used, rejection.requested) == ("tokens", 80, 40)
    assert rejection.retry_after == pytest.approx(58)  # once the t=0 entry expires
    assert accept(log, 2, 20, None, 100)  # a smaller request still fits
    big = log.check(2, 150, None, 100)
    assert big is not None and big.too_large
    state = log.state(30)
    assert (state.requests, state.tokens) == (3, 100)
    assert state.requests_reset == pytest.approx(32)


def test_compaction_keeps_counts_right() -> None:
    log = SlidingWindowLog(window=1)
    for i in range(10_000):
        log.add(i / 1000, 2)
    state = log.state(10.0)
    assert state.requests == 999  # entries strictly after t = 9.0
    assert state.tokens == 2 * 999
    log.clear()
    assert log.state(10.0).requests == 0
    assert log.peak == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.12, "120ms"),
        (0.0004, "1ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.9996, "1m0s"),
        (360, "6m0s"),
        (3723.5, "1h2m3.5s"),
    ],
)
def test_openai_duration_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_retry_after_values_round_up() -> None:
    assert ceil_seconds(0.2) == 1
    assert ceil_seconds(1.0) == 1
    assert ceil_seconds(1.01) == 2
    assert ceil_millis(0.1234) == 124
    assert ceil_millis(0.5) == 500
