"""The fake upstream's strict windows together, and the rate-limit headers each API sends
about them (pure: the caller passes the time and the options).

One sliding log for requests and tokens (`rpm`, `tpm`), one for the same limits pro rata
per `quantum`, one for input tokens (`itpm`) and one for output tokens (`otpm`). Input
counts uncached input plus cache writes, not cache reads (Anthropic's rule for current
models); output is checked with the request's output cap (Anthropic estimates it from
`max_tokens` at admission) and counts the tokens produced, which the fake knows then.
"""

from __future__ import annotations

import math

from . import anthropic
from .bodies import Job
from .config import FakeUpstreamConfig
from .ratelimit import Rejection, SlidingWindowLog, format_duration

_LABELS = {
    "requests": "requests per {} (RPM)",
    "input_tokens": "input tokens per {} (ITPM)",
    "output_tokens": "output tokens per {} (OTPM)",
}


class Windows:
    """The four logs of one fake upstream (one account)."""

    __slots__ = ("input", "main", "output", "quantum")

    def __init__(self, config: FakeUpstreamConfig) -> None:
        self.main = SlidingWindowLog(config.window)
        self.quantum = SlidingWindowLog(config.quantum or config.window)
        self.input = SlidingWindowLog(config.window)
        self.output = SlidingWindowLog(config.window)

    def resize(self, config: FakeUpstreamConfig) -> None:
        """Follow a runtime change of `window` / `quantum`; the logs are kept."""
        self.main.window = self.input.window = self.output.window = config.window
        self.quantum.window = config.quantum or config.window

    def clear(self) -> None:
        for log in (self.main, self.quantum, self.input, self.output):
            log.clear()

    @property
    def peak(self) -> int:
        """The most requests accepted within one window (measured even without limits)."""
        return self.main.peak

    def check(self, now: float, job: Job, config: FakeUpstreamConfig) -> Rejection | None:
        """The first limit `job` would break now; records nothing."""
        rejection = self.main.check(now, job.cost, config.rpm, config.tpm)
        if rejection is None and config.quantum:
            rpm, tpm = pro_rata(config.rpm, config), pro_rata(config.tpm, config)
            rejection = self.quantum.check(now, job.cost, rpm, tpm)
        if rejection is None and config.itpm is not None:
            cost = input_cost(job)
            rejection = self.input.check(now, cost, None, config.itpm, "input_tokens")
        if rejection is None and config.otpm is not None:
            cost = job.max_output
            rejection = self.output.check(now, cost, None, config.otpm, "output_tokens")
        return rejection

    def add(self, now: float, job: Job, config: FakeUpstreamConfig) -> None:
        """Record an accepted `job` in the windows that are on (the main log always)."""
        self.main.add(now, job.cost)
        if config.quantum:
            self.quantum.add(now, job.cost)
        if config.itpm is not None:
            self.input.add(now, input_cost(job))
        if config.otpm is not None:
            self.output.add(now, job.completion_tokens)

    def openai_headers(self, now: float, config: FakeUpstreamConfig) -> dict[str, str]:
        """OpenAI's x-ratelimit-*; a reset is when the window is empty again."""
        headers: dict[str, str] = {}
        state = self.main.state(now)
        # OpenAI announces its limits per minute; so does the fake, whatever its window.
        per_minute = 60.0 / config.window
        if config.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(round(config.rpm * per_minute))
            headers["x-ratelimit-remaining-requests"] = str(max(0, config.rpm - state.requests))
            headers["x-ratelimit-reset-requests"] = format_duration(state.requests_reset)
        if config.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(round(config.tpm * per_minute))
            headers["x-ratelimit-remaining-tokens"] = str(max(0, config.tpm - state.tokens))
            headers["x-ratelimit-reset-tokens"] = format_duration(state.tokens_reset)
        return headers

    def azure_headers(self, now: float, config: FakeUpstreamConfig) -> dict[str, str]:
        """Azure says only what is left."""
        headers: dict[str, str] = {}
        state = self.main.state(now)
        if config.rpm is not None:
            headers["x-ratelimit-remaining-requests"] = str(max(0, config.rpm - state.requests))
        if config.tpm is not None:
            headers["x-ratelimit-remaining-tokens"] = str(max(0, config.tpm - state.tokens))
        return headers

    def anthropic_headers(
        self, now: float, config: FakeUpstreamConfig, wall: float | None = None
    ) -> dict[str, str]:
        """anthropic-ratelimit-* for the windows that are on (`wall`: the wall-clock time
        resets are counted from; now by default)."""
        windows: dict[str, tuple[int, int, float]] = {}
        if config.rpm is not None:
            state = self.main.state(now)
            windows["requests"] = (config.rpm, state.requests, state.requests_reset)
        if config.itpm is not None:
            state = self.input.state(now)
            windows["input_tokens"] = (config.itpm, state.tokens, state.tokens_reset)
        if config.otpm is not None:
            state = self.output.state(now)
            windows["output_tokens"] = (config.otpm, state.tokens, state.tokens_reset)
        return anthropic.limit_headers(windows, 60.0 / config.window, wall)


def limited(config: FakeUpstreamConfig) -> bool:
    return not (config.rpm is None and config.tpm is None and not config.itpm and not config.otpm)


def input_cost(job: Job) -> int:
    """What counts toward an input-token limit: uncached input and cache writes."""
    return job.prompt_tokens + job.cache_write


def pro_rata(limit: int | None, config: FakeUpstreamConfig) -> int | None:
    """A limit per window as a limit per quantum (at least one)."""
    if limit is None or not config.quantum:
        return limit
    return max(1, math.floor(limit * config.quantum / config.window))


def rate_limit_message(rejection: Rejection, model: str, window: float) -> str:
    """OpenAI's 429 message for `rejection`."""
    unit = "min" if window == 60 else format_duration(window)
    scope = _LABELS.get(rejection.kind, "tokens per {} (TPM)").format(unit)
    if rejection.too_large:
        return (
            f"Request too large for {model} in organization org-fake on {scope}: "
            f"Limit {rejection.limit}, Requested {rejection.requested}. "
            "The input or output tokens must be reduced in order to run successfully."
        )
    return (
        f"Rate limit reached for {model} in organization org-fake on {scope}: "
        f"Limit {rejection.limit}, Used {rejection.used}, Requested {rejection.requested}. "
        f"Please try again in {format_duration(rejection.retry_after)}."
    )
