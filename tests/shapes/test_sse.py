"""Usage is read from a passing SSE stream; the proxy's own usage event is removed."""

import pytest

from proxy.costs import MAX_COUNT, TokenUsage
from proxy.shapes.openai import OpenAIStreamUsage, token_usage, usage_of_payload
from proxy.shapes.sse import MAX_HELD, UsageTap

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def _tap(strip_usage_event: bool) -> UsageTap:
    return UsageTap(OpenAIStreamUsage(), strip_usage_event=strip_usage_event)


def test_passes_chunks_through_and_reads_usage() -> None:
    tap = _tap(strip_usage_event=False)
    out = b"".join(tap.feed(c) for c in (CHUNK, USAGE, DONE)) + tap.flush()
    assert out == CHUNK + USAGE + DONE
    assert tap.usage == TokenUsage(input_tokens=7, output_tokens=3)


def test_strips_the_usage_event_it_asked_for() -> None:
    tap = _tap(strip_usage_event=True)
    out = b"".join(tap.feed(c) for c in (CHUNK, USAGE, DONE)) + tap.flush()
    assert out == CHUNK + DONE
    assert tap.usage is not None and tap.usage.output_tokens == 3


def test_events_split_across_chunks() -> None:
    tap = _tap(strip_usage_event=True)
    whole = CHUNK + USAGE + DONE
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    out = b"".join(tap.feed(p) for p in pieces) + tap.flush()
    assert out == CHUNK + DONE
    assert tap.usage is not None and tap.usage.input_tokens == 7


@pytest.mark.parametrize("count", [-5, -1, -(2.0**64), 12.5, "12", True, [1]])
@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
def test_a_usage_with_a_count_that_is_no_count_is_unreadable(count: object, field: str) -> None:
    """Not the other count alone (its request would be charged 0 for the garbled one):
    none, and the request is charged its estimate."""
    counts = {"prompt_tokens": 7, "completion_tokens": 3, field: count}
    assert usage_of_payload({"usage": counts}) is None
    details = {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": count}}
    assert usage_of_payload({"usage": details}) is None


@pytest.mark.parametrize("count", [2**64 + 1, 2.0**64, 1e300, 10**12])
def test_an_absurd_usage_count_is_clamped_to_the_bound(count: float) -> None:
    usage = usage_of_payload({"usage": {"prompt_tokens": count, "completion_tokens": 3}})
    assert usage == TokenUsage(input_tokens=MAX_COUNT, output_tokens=3)


def test_a_count_beyond_64_bits_in_a_stream_is_clamped_not_dropped() -> None:
    event = USAGE.replace(b'"prompt_tokens":7', b'"prompt_tokens":18446744073709551617')
    tap = _tap(strip_usage_event=True)
    assert tap.feed(CHUNK + event + DONE) + tap.flush() == CHUNK + DONE
    assert tap.usage == TokenUsage(input_tokens=MAX_COUNT, output_tokens=3)


def test_cached_prompt_tokens_are_read_as_cached_input() -> None:
    usage = usage_of_payload(
        {
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 4},
            }
        }
    )
    assert usage == TokenUsage(input_tokens=9, output_tokens=1, cached_input=4)
    assert usage.total == 10  # cached tokens are part of the prompt, counted once


@pytest.mark.parametrize("piece", [65536, 3 * MAX_HELD + 1], ids=["in-pieces", "at-once"])
def test_a_run_without_an_events_end_is_passed_on_not_held_without_bound(piece: int) -> None:
    """An upstream sending megabytes with no blank line (a gzip bomb of zeros, say)
    while the proxy strips its own usage event: at most MAX_HELD bytes wait, the run's
    own end stays where it was, and the usage event after it is still read and removed."""
    tap = _tap(strip_usage_event=True)
    run = b"\0" * (3 * MAX_HELD) + b"\n"
    out = b""
    for at in range(0, len(run), piece):
        out += tap.feed(run[at : at + piece])
        assert len(run[: at + piece]) - len(out) <= MAX_HELD
    out += tap.feed(b"\n" + USAGE + DONE) + tap.flush()
    assert out == run + b"\n" + DONE
    assert tap.usage == TokenUsage(input_tokens=7, output_tokens=3)


def test_a_usage_event_split_across_chunks_is_read_when_nothing_is_held_back() -> None:
    tap = _tap(strip_usage_event=False)
    whole = CHUNK + USAGE + DONE
    cut = len(CHUNK) + 30  # inside the usage event
    out = tap.feed(whole[:cut]) + tap.feed(whole[cut:]) + tap.flush()
    assert out == whole  # passed on as it came
    assert tap.usage == TokenUsage(input_tokens=7, output_tokens=3)


def test_a_total_beyond_the_prompt_and_the_completion_is_counted_as_output() -> None:
    """``total_tokens`` is what the upstream counted: tokens no count names (an audio or
    reasoning count a compatible server reports apart) are not dropped."""
    counts = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 15}
    assert usage_of_payload({"usage": counts}) == TokenUsage(input_tokens=9, output_tokens=6)


def test_with_a_total_other_counts_are_its_breakdown_and_add_nothing() -> None:
    """A compatible server's prompt_cache_hit_tokens / _miss_tokens split the prompt."""
    counts = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "total_tokens": 105,
        "prompt_cache_hit_tokens": 80,
        "prompt_cache_miss_tokens": 20,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert usage_of_payload({"usage": counts}) == TokenUsage(input_tokens=100, output_tokens=5)


def test_without_a_total_a_count_of_another_name_adds_where_its_name_says() -> None:
    counts = {
        "prompt_tokens": 9,
        "completion_tokens": 1,
        "image_input_tokens": 30,
        "audio_tokens": 2,
        "not_a_count_tokens": "5",
    }
    assert usage_of_payload({"usage": counts}) == TokenUsage(input_tokens=39, output_tokens=3)
    responses = {"input_tokens": 9, "output_tokens": 1, "total_tokens": 12}
    assert token_usage({"usage": responses}, "input_tokens", "output_tokens") == TokenUsage(
        input_tokens=9, output_tokens=3
    )
