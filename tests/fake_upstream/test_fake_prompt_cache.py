"""The fake upstream's prompt cache (``prompt_cache: true``), as Anthropic's: what a
request's ``cache_control`` marks is written once it is admitted and read by the next,
reported as ``cache_creation_input_tokens`` / ``cache_read_input_tokens``; its input
window counts the writes, not the reads. Checked with the official SDK."""

from __future__ import annotations

import math
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import FakeUpstreamHandle
from proxy.fake_upstream.prompt_cache import PromptCache

KEY = "sk-ant-upstream"
TEXT = "Cached instructions. " * 200  # 4,200 characters: 1,050 tokens
# The system prompt is one message: 1,050 + 3, and 3 for the request.
PREFIX = 1_056
# "What now?" (9 characters: 3 tokens) in a message of its own.
QUESTION = 3 + 3
SYSTEM: list[Any] = [{"type": "text", "text": TEXT, "cache_control": {"type": "ephemeral"}}]


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {"api_key": KEY, "prompt_cache": True, "itpm": 1_200, "window": 60}


def _ask(upstream: FakeUpstreamHandle, **extra: Any) -> anthropic.types.Usage:
    client = anthropic.Anthropic(base_url=upstream.url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="claude",
        max_tokens=20,
        system=SYSTEM,
        messages=[{"role": "user", "content": "What now?"}],
        **extra,
    )
    return message.usage


@pytest.mark.slow
def test_the_first_request_writes_the_prefix_and_the_next_read_it(
    upstream: FakeUpstreamHandle,
) -> None:
    first = _ask(upstream)
    assert (first.input_tokens, first.cache_creation_input_tokens) == (QUESTION, PREFIX)
    assert first.cache_read_input_tokens == 0
    for _ in range(10):  # within the window of 1,200 input tokens only because reads are free
        later = _ask(upstream)
        assert (later.input_tokens, later.cache_read_input_tokens) == (QUESTION, PREFIX)
        assert later.cache_creation_input_tokens == 0
    stats = upstream.stats()
    assert stats["input_tokens_admitted"] == PREFIX + 11 * QUESTION
    assert stats["cache_read_tokens_admitted"] == 10 * PREFIX
    assert stats["rejected"] == 0


def test_the_window_counts_the_writes(upstream: FakeUpstreamHandle) -> None:
    """A second prefix written within the window exceeds it: 429."""
    _ask(upstream)
    other: list[Any] = [{**SYSTEM[0], "text": TEXT + "!"}]
    with pytest.raises(anthropic.RateLimitError):
        client = anthropic.Anthropic(base_url=upstream.url, api_key=KEY, max_retries=0)
        client.messages.create(
            model="claude",
            max_tokens=20,
            system=other,
            messages=[{"role": "user", "content": "What now?"}],
        )


@pytest.mark.slow
def test_the_cache_outlives_a_reset_of_the_counters_and_not_being_turned_off(
    upstream: FakeUpstreamHandle,
) -> None:
    _ask(upstream)
    upstream.reset()
    assert _ask(upstream).cache_read_input_tokens == PREFIX
    upstream.control(prompt_cache=False)
    off = _ask(upstream)
    assert (off.input_tokens, off.cache_read_input_tokens) == (PREFIX + QUESTION, 0)
    upstream.control(prompt_cache=True)
    upstream.reset()  # (the window is full)
    assert _ask(upstream).cache_creation_input_tokens == PREFIX  # empty again


def test_an_entry_lives_five_minutes_renewed_by_each_use_or_an_hour() -> None:
    cache = PromptCache()
    body: dict[str, Any] = {"model": "claude", "system": SYSTEM, "messages": []}
    split = cache.split(body, now=0.0)
    assert split is not None and (split.read, split.written) == (0, PREFIX)
    cache.store(split.entries, now=0.0)
    renewed = cache.split(body, now=299.0)
    assert renewed is not None and renewed.read == PREFIX
    cache.store(renewed.entries, now=299.0)
    later = cache.split(body, now=598.0)
    assert later is not None and later.read == PREFIX
    expired = cache.split(body, now=900.0)
    assert expired is not None and expired.read == 0
    hour: list[Any] = [{**SYSTEM[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    long_lived = {**body, "system": hour}
    first = cache.split(long_lived, now=0.0)
    assert first is not None
    cache.store(first.entries, now=0.0)
    kept = cache.split(long_lived, now=3000.0)
    assert kept is not None and kept.read == PREFIX


def test_a_conversation_reads_its_earlier_turns_prefix() -> None:
    """The breakpoint moved to the newest message; the earlier turn's prefix is read,
    what follows it up to the new breakpoint written."""
    cache = PromptCache()
    turn: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": TEXT, "cache_control": {}}]}
    ]
    earlier = cache.split({"model": "claude", "messages": turn}, now=0.0)
    assert earlier is not None
    cache.store(earlier.entries, now=0.0)
    later_turns: list[Any] = [
        {"role": "user", "content": TEXT},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": [{"type": "text", "text": "Then?", "cache_control": {}}]},
    ]
    later = cache.split({"model": "claude", "messages": later_turns}, now=1.0)
    assert later is not None
    assert later.read == earlier.written
    # "An answer." and "Then?": 15 characters more, two messages more
    assert later.written == math.ceil((len(TEXT) + 15) / 4) + 3 * 3 + 3 - PREFIX


def test_nothing_marked_is_nothing_cached() -> None:
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}]}
    assert PromptCache().split(body, now=0.0) is None
