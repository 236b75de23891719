"""What each deployment's prompt cache is known to hold: learned from its answers only,
forgotten before the upstream forgets, and after an answer that read nothing."""

from __future__ import annotations

import orjson

from proxy.costs import TokenUsage
from proxy.routing.prompt_caches import MARGIN, PromptCaches
from proxy.shapes.cache_prefixes import CachePrefixes, prefixes

TEXT = "A long, cached system prompt. " * 40
SYSTEM = [{"type": "text", "text": TEXT, "cache_control": {"type": "ephemeral"}}]
WRITTEN = TokenUsage(input_tokens=13, cache_write=400, output_tokens=5)
READ = TokenUsage(input_tokens=13, cache_read=400, output_tokens=5)
NOTHING_CACHED = TokenUsage(input_tokens=413, output_tokens=5)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _prefixes(question: str) -> CachePrefixes:
    body = {
        "model": "claude",
        "system": SYSTEM,
        "messages": [{"role": "user", "content": question}],
    }
    found = prefixes(body, orjson.dumps(body))
    assert found is not None
    return found


def test_nothing_is_expected_before_an_answer_shows_it_cached() -> None:
    caches = PromptCaches(Clock())
    assert caches.expected_read("d", _prefixes("one?")) == 0


def test_an_answer_that_wrote_the_cache_makes_the_prefix_expected_on_that_deployment() -> None:
    caches = PromptCaches(Clock())
    first = _prefixes("one?")
    caches.answered("d", first, WRITTEN, sent=100.0)
    system = first.breakpoints[0][0].tokens
    assert caches.expected_read("d", _prefixes("another question?")) == system
    assert caches.expected_read("elsewhere", _prefixes("another question?")) == 0


def test_an_entry_is_forgotten_before_its_lifetime_ends_upstream() -> None:
    clock = Clock()
    caches = PromptCaches(clock)
    caches.answered("d", _prefixes("one?"), WRITTEN, sent=100.0)
    clock.now = 100.0 + 300.0 - MARGIN - 0.5
    assert caches.expected_read("d", _prefixes("two?")) > 0
    clock.now = 100.0 + 300.0 - MARGIN
    assert caches.expected_read("d", _prefixes("two?")) == 0


def test_a_use_renews_it() -> None:
    clock = Clock()
    caches = PromptCaches(clock)
    caches.answered("d", _prefixes("one?"), WRITTEN, sent=100.0)
    caches.answered("d", _prefixes("two?"), READ, sent=350.0)
    clock.now = 600.0
    assert caches.expected_read("d", _prefixes("three?")) > 0


def test_an_answer_that_read_nothing_forgets_what_was_looked_up() -> None:
    """Evicted early, or too short for the upstream to cache: charged whole again."""
    caches = PromptCaches(Clock())
    caches.answered("d", _prefixes("one?"), WRITTEN, sent=100.0)
    caches.answered("d", _prefixes("two?"), NOTHING_CACHED, sent=101.0)
    assert caches.expected_read("d", _prefixes("three?")) == 0
    assert len(caches) == 0


def test_it_holds_a_bounded_number_of_entries_the_oldest_going_first() -> None:
    caches = PromptCaches(Clock(), size=2)
    for name in ("a", "b", "c"):
        caches.answered(name, _prefixes("q"), WRITTEN, sent=100.0)
    assert len(caches) == 2
    assert caches.expected_read("a", _prefixes("q")) == 0
    assert caches.expected_read("c", _prefixes("q")) > 0
