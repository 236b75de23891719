"""The sliding-window log and the header formats, with an explicit clock (no sleeps)."""

from __future__ import annotations

import pytest

from proxy.fake_upstream import FakeUpstreamConfig, SlidingWindowLog, format_duration
from proxy.fake_upstream.bodies import Job
from proxy.fake_upstream.ratelimit import ceil_millis, ceil_seconds
from proxy.fake_upstream.windows import Windows


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


# ------------------------------------------------------------------ input and output windows


def _message_job(prompt: int, max_tokens: int, produced: int, cache_write: int = 0) -> Job:
    return Job(
        "claude-x",
        prompt,
        produced,
        prompt + max_tokens,
        max_output=max_tokens,
        cache_read=1000,
        cache_write=cache_write,
    )


def test_input_window_counts_uncached_input_and_cache_writes_until_they_expire() -> None:
    config = FakeUpstreamConfig(itpm=100, window=10)
    windows = Windows(config)
    job = _message_job(prompt=30, max_tokens=5, produced=5, cache_write=10)  # 40, reads free
    for now in (0.0, 1.0):
        assert windows.check(now, job, config) is None
        windows.add(now, job, config)
    rejection = windows.check(2.0, job, config)
    assert rejection is not None and rejection.kind == "input_tokens"
    assert rejection.used == 80 and rejection.retry_after == pytest.approx(8.0)
    assert windows.check(10.0, job, config) is None  # the first one left the window


def test_output_window_checks_the_cap_and_counts_what_was_produced() -> None:
    config = FakeUpstreamConfig(otpm=100, window=10)
    windows = Windows(config)
    job = _message_job(prompt=1, max_tokens=60, produced=30)
    windows.add(0.0, job, config)
    assert windows.check(0.5, job, config) is None  # 30 used + cap 60 fits
    windows.add(0.5, job, config)
    rejection = windows.check(1.0, job, config)  # 60 used + cap 60 does not
    assert rejection is not None and rejection.kind == "output_tokens"
    assert rejection.retry_after == pytest.approx(9.0)
    too_large = windows.check(1.0, _message_job(1, 101, 1), config)
    assert too_large is not None and too_large.too_large


def test_anthropic_headers_count_resets_from_the_wall_clock() -> None:
    config = FakeUpstreamConfig(rpm=5, itpm=100, otpm=50, window=60)
    windows = Windows(config)
    windows.add(0.0, _message_job(prompt=30, max_tokens=40, produced=10), config)
    headers = windows.anthropic_headers(20.0, config, wall=1_700_000_000.0)
    assert headers["anthropic-ratelimit-requests-remaining"] == "4"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "70"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "40"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "40"  # the least left
    # the request leaves the window at 60, 40 s after `now`
    assert headers["anthropic-ratelimit-input-tokens-reset"] == "2023-11-14T22:14:00Z"
