"""Where a Messages request may be read from Anthropic's prompt cache: its breakpoints'
prefixes and the boundaries a hit is looked for at, fingerprinted as the cache keys them
and estimated on the scale of the request's whole estimate."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.shapes.cache_prefixes import LOOKBACK, CachePrefixes, prefixes
from proxy.shapes.messages import MESSAGES
from proxy.shapes.tokens import messages_input_tokens

EPHEMERAL = {"type": "ephemeral"}
LONG = "You answer questions about the proxy's accounting. " * 40


def _of(body: dict[str, Any]) -> CachePrefixes | None:
    return prefixes(body, orjson.dumps(body))


def _cached_system(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude",
        "max_tokens": 20,
        "system": [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}],
        "messages": [{"role": "user", "content": question}],
        **extra,
    }


def test_a_request_that_marks_nothing_has_no_prefixes() -> None:
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}]}
    assert _of(body) is None
    assert MESSAGES.cache_prefixes(body, orjson.dumps(body)) is None


def test_a_marked_system_prompt_is_a_breakpoint_estimated_as_the_whole_is() -> None:
    """What is left of the estimate without the prefix is the estimate of the question:
    the proxy's count of what the cache does not serve."""
    body = _cached_system("What does it count?")
    found = _of(body)
    assert found is not None
    [(breakpoint, ttl)] = found.breakpoints
    assert ttl == 300.0
    assert found.lookups == (breakpoint,)  # the system prompt is the first block
    whole = messages_input_tokens(body)
    assert whole - breakpoint.tokens == 4 + len("What does it count?") // 4 + 1
    assert MESSAGES.cache_prefixes(body, orjson.dumps(body)) == found


def test_the_same_prefix_whatever_follows_it_and_wherever_its_mark() -> None:
    """Two questions after one cached system prompt share its fingerprint; a text as a
    string or as a block, marked or not, is the same text."""
    first, second = _of(_cached_system("one?")), _of(_cached_system("two, longer?"))
    assert first is not None and second is not None
    assert first.breakpoints[0][0] == second.breakpoints[0][0]
    as_string = _of(
        {
            "model": "claude",
            "system": LONG,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x", **_mark()}]}],
        }
    )
    assert as_string is not None
    assert first.breakpoints[0][0].digest in {p.digest for p in as_string.lookups}


def _mark() -> dict[str, Any]:
    return {"cache_control": EPHEMERAL}


def test_another_model_or_another_prompt_is_another_prefix() -> None:
    base = _of(_cached_system("q"))
    other_model = _of({**_cached_system("q"), "model": "claude-other"})
    other_prompt = _of(
        {**_cached_system("q"), "system": [{"type": "text", "text": LONG + "!", **_mark()}]}
    )
    assert base is not None and other_model is not None and other_prompt is not None
    digest = base.breakpoints[0][0].digest
    assert digest != other_model.breakpoints[0][0].digest
    assert digest != other_prompt.breakpoints[0][0].digest


def test_a_conversation_finds_its_last_turns_prefix_among_its_lookups() -> None:
    """The breakpoint moves to the newest message; the prefix the previous request cached
    (up to its own last message) is a boundary a hit is looked for at."""
    turn = [{"role": "user", "content": [{"type": "text", "text": LONG, **_mark()}]}]
    earlier = _of({"model": "claude", "messages": turn})
    later_turns = [
        {"role": "user", "content": [{"type": "text", "text": LONG}]},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": [{"type": "text", "text": "And then?", **_mark()}]},
    ]
    later = _of({"model": "claude", "messages": later_turns})
    assert earlier is not None and later is not None
    cached = earlier.breakpoints[0][0]
    assert cached in later.lookups
    assert later.lookups[0] == later.breakpoints[0][0]  # the longest first
    assert [p.tokens for p in later.lookups] == sorted(
        (p.tokens for p in later.lookups), reverse=True
    )


def test_hits_are_looked_for_at_most_twenty_blocks_before_a_breakpoint() -> None:
    blocks = [{"type": "text", "text": f"part {i}"} for i in range(30)]
    blocks[-1] = {**blocks[-1], **_mark()}
    found = _of({"model": "claude", "messages": [{"role": "user", "content": blocks}]})
    assert found is not None
    assert len(found.lookups) == LOOKBACK + 1


def test_a_top_level_mark_caches_up_to_the_last_block_and_an_hour_lives_an_hour() -> None:
    body = {
        "model": "claude",
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "the whole prompt"}],
    }
    found = _of(body)
    assert found is not None
    [(breakpoint, ttl)] = found.breakpoints
    assert ttl == 3600.0
    assert breakpoint.tokens == messages_input_tokens(body)  # all of it


def test_a_prefix_among_the_tools_is_estimated_low() -> None:
    """The tools are estimated together, on the last: a prefix ending before it leaves
    them out (never more read from the cache than the estimate holds)."""
    tools: list[dict[str, Any]] = [{"name": f"tool{i}", "input_schema": {}} for i in range(3)]
    tools[0] = {**tools[0], **_mark()}
    found = _of({"model": "claude", "tools": tools, "messages": []})
    assert found is not None
    assert found.breakpoints[0][0].tokens == 3  # the request's framing only


def test_a_block_too_deep_to_write_gives_no_prefixes() -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    body = {"model": "claude", "system": [{"type": "text", "text": "s", **_mark()}, deep]}
    raw = b'{"system": [{"cache_control": ...}, [[[...]]]]}'  # as read: deeper than orjson writes
    assert prefixes(body, raw) is None
