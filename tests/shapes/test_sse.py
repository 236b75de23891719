"""Usage is read from a passing SSE stream; the proxy's own usage event is removed."""

import pytest

from proxy.costs import TokenUsage
from proxy.shapes.openai import OpenAIStreamUsage, usage_of_payload
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


@pytest.mark.parametrize("count", [-5, -1])
def test_a_negative_usage_count_is_unknown(count: int) -> None:
    usage = usage_of_payload({"usage": {"prompt_tokens": count, "completion_tokens": 3}})
    assert usage == TokenUsage(output_tokens=3)
    assert usage_of_payload({"usage": {"prompt_tokens": count}}) is None


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
