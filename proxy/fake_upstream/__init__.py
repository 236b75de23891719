"""A fast fake upstream: OpenAI's APIs (chat, completions, embeddings, the Responses API),
Azure OpenAI's paths and Anthropic's Messages API; latency, streaming, strict sliding-window
rate limits with each API's 429s and headers, failure injection, and counters.

Standalone (imports nothing else from `proxy`). See docs/fake_upstream.md.

    with run_in_thread(FakeUpstreamConfig(port=0, rpm=5, window=1)) as upstream:
        client = openai.OpenAI(base_url=upstream.base_url, api_key="x")
        ...
        assert upstream.stats()["rejected"] == 0
"""

from .app import UPSTREAM_KEY, FakeUpstream, build_app
from .bodies import estimate_chat_prompt_tokens, estimate_input_tokens
from .cli import main
from .config import FakeUpstreamConfig, parse_latency
from .ratelimit import SlidingWindowLog, format_duration
from .runner import FakeUpstreamHandle, run_in_thread, serve

__all__ = [
    "UPSTREAM_KEY",
    "FakeUpstream",
    "FakeUpstreamConfig",
    "FakeUpstreamHandle",
    "SlidingWindowLog",
    "build_app",
    "estimate_chat_prompt_tokens",
    "estimate_input_tokens",
    "format_duration",
    "main",
    "parse_latency",
    "run_in_thread",
    "serve",
]
