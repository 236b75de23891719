"""Usage is read from a passing SSE stream; the proxy's own usage event is removed."""

import pytest

from proxy.upstream.sse import UsageTap, usage_counts

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_passes_chunks_through_and_reads_usage() -> None:
    tap = UsageTap(strip_usage_event=False)
    out = b"".join(tap.feed(c) for c in (CHUNK, USAGE, DONE)) + tap.flush()
    assert out == CHUNK + USAGE + DONE
    assert (tap.prompt_tokens, tap.completion_tokens) == (7, 3)


def test_strips_the_usage_event_it_asked_for() -> None:
    tap = UsageTap(strip_usage_event=True)
    out = b"".join(tap.feed(c) for c in (CHUNK, USAGE, DONE)) + tap.flush()
    assert out == CHUNK + DONE
    assert tap.completion_tokens == 3


def test_events_split_across_chunks() -> None:
    tap = UsageTap(strip_usage_event=True)
    whole = CHUNK + USAGE + DONE
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    out = b"".join(tap.feed(p) for p in pieces) + tap.flush()
    assert out == CHUNK + DONE
    assert tap.prompt_tokens == 7


@pytest.mark.parametrize("count", [-5, -1])
def test_a_negative_usage_count_is_unknown(count: int) -> None:
    assert usage_counts({"usage": {"prompt_tokens": count, "completion_tokens": 3}}) == (None, 3)
