"""A deployment's windows count tokens as its provider does, at admission and after the
answer (providers/*.py, ``Counting``), on a request's journey without servers
(support/journey.py: the memory limiter on a clock that stands still, a scripted
upstream). Its windows are a day long here, so what each charged is what it left."""

from __future__ import annotations

from typing import Any

import httpx
from support.journey import Journey, Upstream, deployment

from proxy.costs import Cost
from proxy.limiter.base import DeploymentVerdict, GroupAsk
from proxy.limiter.memory import MemoryLimiter
from proxy.shapes.messages import MESSAGES
from proxy.shapes.tokens import messages_input_tokens

LIMIT = 1_000_000
DAY = [
    {"input_tokens": LIMIT, "per": "1d"},
    {"output_tokens": LIMIT, "per": "1d"},
    {"tokens": LIMIT, "per": "1d"},
]
SYSTEM = [
    {
        "type": "text",
        "text": "A long system prompt the client caches. " * 50,
        "cache_control": {"type": "ephemeral"},
    }
]
CACHED = 500  # what the upstream reports written to or read from its cache
UNCACHED = 13  # and what it reports outside it


def _message(question: str) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 100,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": question}],
    }


def _anthropic_answer(read: int, written: int) -> httpx.Response:
    usage = {
        "input_tokens": UNCACHED,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": 7,
    }
    body = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": usage}
    return httpx.Response(200, json=body)


class Cache:
    """An upstream cache as Anthropic's: the first request writes, the next ones read
    (``evicted``: the next one writes again)."""

    def __init__(self) -> None:
        self.written = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.written:
            return _anthropic_answer(read=CACHED, written=0)
        self.written = True
        return _anthropic_answer(read=0, written=CACHED)


def _journey(provider: str, answer: Any) -> tuple[Journey, list[Cost]]:
    data = {
        "keys": [{"name": "k", "key": "sk-client"}],
        "models": [{"name": "m", "deployments": [deployment("a", provider=provider, limits=DAY)]}],
    }
    if provider == "anthropic":
        data["models"][0]["deployments"][0]["base_url"] = "http://a.test"
    journey = Journey(data, Upstream({"a.test": answer}))
    asked: list[Cost] = []
    limiter = journey.pipeline.limiter
    assert isinstance(limiter, MemoryLimiter)
    real_reserve_now = limiter.reserve_now

    def reserve_now(ask: GroupAsk) -> DeploymentVerdict:
        asked.append(ask.cost)
        return real_reserve_now(ask)

    limiter.reserve_now = reserve_now  # type: ignore[method-assign]
    return journey, asked


async def _charged(journey: Journey) -> dict[str, float]:
    """What the deployment's windows hold now (the clock stood still)."""
    catalog = journey.pipeline.catalog
    limits = [catalog.limits(d) for d in catalog.groups["m"].deployments]
    state = (await journey.pipeline.limiter.snapshot("m", limits))["a"]
    return {name: LIMIT - left for name, left in state.remaining.items()}


async def test_anthropic_admits_without_the_cache_reads_its_answers_showed() -> None:
    """The first request is charged its whole input (nothing known cached yet) and
    settled to what Anthropic counts: uncached input and the cache write, the real
    output. The next, of the same prefix, is charged without it, and settled likewise:
    the cache read is in none of the deployment's windows."""
    journey, asked = _journey("anthropic", Cache())
    first, second = _message("One?"), _message("Two?")
    assert (await journey.send(first, MESSAGES)).status == 200
    whole = messages_input_tokens(first)
    assert asked[0]["input_tokens"] == whole
    assert await _charged(journey) == {
        "input_tokens_1d": UNCACHED + CACHED,
        "output_tokens_1d": 7,
        "tpd": UNCACHED + CACHED + 7,
    }
    assert (await journey.send(second, MESSAGES)).status == 200
    prefix = whole - (4 + len("Two?") // 4 + 1)  # the question's estimate is what is left
    assert asked[1]["input_tokens"] == whole - prefix
    assert asked[1]["output_tokens"] == 100  # max_tokens, adjusted after
    assert await _charged(journey) == {
        "input_tokens_1d": 2 * UNCACHED + CACHED,
        "output_tokens_1d": 14,
        "tpd": 2 * UNCACHED + CACHED + 14,
    }


async def test_an_anthropic_cache_miss_is_charged_whole_and_forgets_the_prefix() -> None:
    """The proxy expected a read; the upstream had evicted it and wrote it again: the
    settlement charges the write, and the next request is estimated whole again."""
    answers = iter(
        [
            _anthropic_answer(read=0, written=CACHED),
            _anthropic_answer(read=0, written=0),  # not cached at all now
            _anthropic_answer(read=0, written=0),
        ]
    )
    journey, asked = _journey("anthropic", lambda _: next(answers))
    for question in ("One?", "Two?", "Six?"):
        assert (await journey.send(_message(question), MESSAGES)).status == 200
    whole = messages_input_tokens(_message("Six?"))
    assert asked[1]["input_tokens"] < whole  # expected from the first answer
    assert asked[2]["input_tokens"] == whole  # forgotten after the second
    charged = await _charged(journey)
    assert charged["input_tokens_1d"] == 3 * UNCACHED + CACHED


async def test_openai_counts_cached_prompt_tokens_and_keeps_its_estimate() -> None:
    """OpenAI's cached tokens are part of the prompt its TPM counts: the request is
    charged its whole estimate, and nothing is given back of the prompt or the cap."""
    usage = {
        "prompt_tokens": 400,
        "completion_tokens": 7,
        "total_tokens": 407,
        "prompt_tokens_details": {"cached_tokens": 384},
    }
    body = {"id": "x", "object": "chat.completion", "choices": [], "usage": usage}
    journey, asked = _journey("openai", lambda _: httpx.Response(200, json=body))
    request = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
    assert (await journey.send(request)).status == 200
    estimate = asked[0]
    charged = await _charged(journey)
    assert charged["input_tokens_1d"] == max(400, estimate["input_tokens"])  # all 400 count
    assert charged["output_tokens_1d"] == 100  # the cap, kept
    assert charged["tpd"] == charged["input_tokens_1d"] + 100
