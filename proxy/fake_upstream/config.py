"""Options of the fake upstream, their validation and their runtime updates."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .azure import DEFAULT_API_VERSIONS

Latency = float | tuple[float, float]
LatencySpec = Latency | str | list[float]  # what callers may pass; normalised to Latency

DEFAULT_MODELS: tuple[str, ...] = (
    "gpt-4o-mini",
    "gpt-4o",
    "gpt-3.5-turbo-instruct",
    "text-embedding-3-small",
)

# Fields that `POST /control` and `FakeUpstreamHandle.control()` may change. The others
# (host, port, models, ...) are fixed once the server is built.
RUNTIME_FIELDS: frozenset[str] = frozenset(
    {
        "latency",
        "rpm",
        "tpm",
        "itpm",
        "otpm",
        "cache_read_tokens",
        "cache_write_tokens",
        "prompt_cache",
        "window",
        "quantum",
        "ratelimit_headers",
        "fail_rate",
        "fail_status",
        "echo_status",
        "hang_rate",
        "drop_rate",
        "fail_after_chunks",
        "error_after_chunks",
        "stream_chunks",
        "chunk_delay",
        "completion_tokens",
        "api_key",
        "seed",
    }
)


@dataclass
class FakeUpstreamConfig:
    """Everything the fake upstream can be told; see docs/fake_upstream.md.

    `latency` is seconds, either fixed or a `(low, high)` range drawn uniformly per
    request; the string forms `"0.05"` and `"0.02-0.2"` are accepted and normalised.
    `rpm`/`tpm` of None (or 0) mean no limit.
    """

    host: str = "127.0.0.1"
    port: int = 8001
    latency: LatencySpec = 0.0
    stream_chunks: int = 8
    chunk_delay: float = 0.01
    completion_tokens: int = 16
    rpm: int | None = None
    tpm: int | None = None
    # Input and output tokens per window, apart (Anthropic's ITPM / OTPM), on every API:
    # input counts uncached input and cache writes, not cache reads; output is checked
    # against the request's max tokens at admission and counts the tokens produced.
    itpm: int | None = None
    otpm: int | None = None
    window: float = 60.0
    # Limits also enforced over every `quantum` seconds, pro rata (OpenAI's "quantized"
    # limits: 60,000 a minute may be enforced as 1,000 a second). None: off.
    quantum: float | None = None
    ratelimit_headers: bool = True  # send x-ratelimit-* headers (429s keep retry-after)
    fail_rate: float = 0.0
    fail_status: int = 500
    # Answer every inference request with this status, quoting the Authorization it got
    # (as some servers' error answers do): in the body, in a header and, for a streamed
    # 200, split across two writes. None: off. For redaction tests.
    echo_status: int | None = None
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    fail_after_chunks: int = 0
    # End every stream after K events with the API's in-stream error (chat: an `error`
    # chunk; Responses: `response.failed`; Messages: `event: error`, overloaded_error),
    # the body complete. 0: off.
    error_after_chunks: int = 0
    seed: int | None = None
    api_key: str | None = None
    models: tuple[str, ...] = field(default=DEFAULT_MODELS)
    # Azure OpenAI mode (azure.py): its paths, api-key and api-version; `models` are then
    # the deployments it has.
    azure: bool = False
    azure_api_versions: tuple[str, ...] = field(default=DEFAULT_API_VERSIONS)
    embedding_dims: int = 8
    # Input tokens every answer reports as read from / written to a prompt cache (Responses:
    # `cached_tokens`, at most the input; Messages: the cache counts, on top of the input).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # A prompt cache for the Messages API, as Anthropic's (prompt_cache.py): what a
    # request's `cache_control` breakpoints mark is cached once it is admitted, and later
    # requests read it (`cache_read_input_tokens`, which `itpm` does not count).
    prompt_cache: bool = False
    access_log: bool = False
    # Google Vertex AI (vertex.py): the service accounts whose JWT assertions its token
    # endpoint (POST /token) accepts, each (client_email, public key PEM), and how long
    # the access tokens it issues live, in seconds.
    google_service_accounts: tuple[tuple[str, str], ...] = ()
    token_lifetime: float = 3600.0
    # Bedrock's SigV4 keys (bedrock.py): requests' signatures recomputed from them and
    # checked. None: any well-formed signature is taken.
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    _latency_range: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.latency = parse_latency(self.latency)
        low_high = self.latency if isinstance(self.latency, tuple) else (self.latency,) * 2
        self._latency_range = (low_high[0], low_high[1])
        self.rpm = _optional_limit("rpm", self.rpm)
        self.tpm = _optional_limit("tpm", self.tpm)
        self.itpm = _optional_limit("itpm", self.itpm)
        self.otpm = _optional_limit("otpm", self.otpm)
        self.models = tuple(self.models)
        self.azure_api_versions = tuple(self.azure_api_versions)
        _validate(self)

    @property
    def latency_range(self) -> tuple[float, float]:
        """The latency as a `(low, high)` pair, equal bounds for a fixed latency."""
        return self._latency_range

    def updated(self, changes: Mapping[str, Any]) -> FakeUpstreamConfig:
        """A copy with the runtime-settable `changes` applied; ValueError if any is bad."""
        unknown = sorted(set(changes) - RUNTIME_FIELDS)
        if unknown:
            raise ValueError(f"unknown or fixed option(s): {', '.join(unknown)}")
        for name, value in changes.items():
            _check_json_type(name, value)
        return dataclasses.replace(self, **dict(changes))

    def runtime_options(self) -> dict[str, Any]:
        """The runtime-settable options as a JSON-ready dict (what `/control` returns)."""
        options: dict[str, Any] = {name: getattr(self, name) for name in sorted(RUNTIME_FIELDS)}
        if isinstance(self.latency, tuple):
            options["latency"] = list(self.latency)
        return options

    def describe(self) -> str:
        """A one-line summary for the start-up log."""
        low, high = self.latency_range
        latency = f"{low:g}s" if low == high else f"{low:g}-{high:g}s"
        parts = [
            f"rpm={self.rpm or 'off'}",
            f"tpm={self.tpm or 'off'}",
            *([f"itpm={self.itpm}"] if self.itpm else []),
            *([f"otpm={self.otpm}"] if self.otpm else []),
            f"window={self.window:g}s",
            *([f"quantum={self.quantum:g}s"] if self.quantum else []),
            f"latency={latency}",
            f"stream_chunks={self.stream_chunks}",
            f"chunk_delay={self.chunk_delay:g}s",
        ]
        faults = {
            "fail_rate": self.fail_rate,
            "hang_rate": self.hang_rate,
            "drop_rate": self.drop_rate,
            "fail_after_chunks": self.fail_after_chunks,
            "error_after_chunks": self.error_after_chunks,
        }
        parts.extend(f"{name}={value:g}" for name, value in faults.items() if value)
        parts.extend(self._modes())
        if self.api_key is not None:
            parts.append("api_key=set")
        if self.azure:
            parts.append(f"azure (deployments: {', '.join(self.models)})")
        return ", ".join(parts)

    def _modes(self) -> list[str]:
        """The modes that are on, by name (the start-up line's)."""
        return ["prompt_cache"] if self.prompt_cache else []


def parse_latency(value: object) -> Latency:
    """Normalise `0.05`, `"0.05"`, `"0.02-0.2"`, `[0.02, 0.2]` to a float or a range."""
    if isinstance(value, str):
        low_text, sep, high_text = value.strip().partition("-")
        try:
            low = float(low_text)
            high = float(high_text) if sep else low
        except ValueError:
            raise ValueError(f"latency: expected SECONDS or LOW-HIGH, got {value!r}") from None
        return _latency_pair(low, high)
    if isinstance(value, list | tuple):
        if len(value) != 2 or not all(_is_number(v) for v in value):
            raise ValueError(f"latency: expected [low, high], got {value!r}")
        return _latency_pair(float(value[0]), float(value[1]))
    if _is_number(value):
        seconds = float(value)  # type: ignore[arg-type]
        _require(math.isfinite(seconds) and seconds >= 0, "latency must be >= 0")
        return seconds
    raise ValueError(f"latency: expected a number, a range string or a pair, got {value!r}")


def _latency_pair(low: float, high: float) -> Latency:
    _require(math.isfinite(high) and 0 <= low <= high, "latency range must be 0 <= low <= high")
    return low if low == high else (low, high)


def _optional_limit(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    _require(_is_int(value) and value >= 0, f"{name} must be a non-negative integer or null")
    return value or None  # 0 means "no limit", like None


def _validate(config: FakeUpstreamConfig) -> None:
    """``ValueError`` naming the first option that is wrong, checked in a fixed order."""
    _validate_counts(config)
    _validate_windows(config)
    _validate_failures(config)
    _validate_answers(config)


def _validate_counts(config: FakeUpstreamConfig) -> None:
    """The port, the chunk and token counts: integers in their ranges."""
    for name in (
        "port",
        "stream_chunks",
        "completion_tokens",
        "fail_after_chunks",
        "error_after_chunks",
    ):
        _require(_is_int(getattr(config, name)), f"{name} must be an integer")
    for name in ("cache_read_tokens", "cache_write_tokens"):
        value = getattr(config, name)
        _require(_is_int(value) and value >= 0, f"{name} must be an integer >= 0")
    _require(0 <= config.port <= 65535, "port must be in 0..65535")
    _require(config.stream_chunks >= 1, "stream_chunks must be >= 1")
    _require(config.completion_tokens >= 1, "completion_tokens must be >= 1")
    _require(config.fail_after_chunks >= 0, "fail_after_chunks must be >= 0 (0 = off)")
    _require(config.error_after_chunks >= 0, "error_after_chunks must be >= 0 (0 = off)")


def _validate_windows(config: FakeUpstreamConfig) -> None:
    """The rate limits' window, its quantum and whether the headers tell of them."""
    _require(_is_number(config.window) and config.window > 0, "window must be > 0")
    _require(
        config.quantum is None
        or (_is_number(config.quantum) and 0 < config.quantum <= config.window),
        "quantum must be > 0 and at most window (or null: off)",
    )
    _require(isinstance(config.ratelimit_headers, bool), "ratelimit_headers must be true/false")


def _validate_failures(config: FakeUpstreamConfig) -> None:
    """The delay and the faults: rates that are probabilities together, HTTP statuses."""
    _require(_is_number(config.chunk_delay) and config.chunk_delay >= 0, "chunk_delay >= 0")
    for name in ("fail_rate", "hang_rate", "drop_rate"):
        rate = getattr(config, name)
        _require(_is_number(rate) and 0 <= rate <= 1, f"{name} must be in [0, 1]")
    total = config.fail_rate + config.hang_rate + config.drop_rate
    _require(total <= 1, "fail_rate + hang_rate + drop_rate must be <= 1")
    _require(
        _is_int(config.fail_status) and 400 <= config.fail_status <= 599,
        "fail_status must be an HTTP error status (400..599)",
    )
    _require(
        config.echo_status is None
        or (_is_int(config.echo_status) and 200 <= config.echo_status <= 599),
        "echo_status must be an HTTP status (200..599) or null",
    )


def _validate_answers(config: FakeUpstreamConfig) -> None:
    """What shapes the answers: the seed, the key required, embeddings, models, Azure."""
    _require(config.seed is None or _is_int(config.seed), "seed must be an integer or null")
    _require(config.api_key is None or isinstance(config.api_key, str), "api_key must be a string")
    _require(_is_int(config.embedding_dims) and config.embedding_dims >= 1, "embedding_dims >= 1")
    _require(all(isinstance(m, str) for m in config.models), "models must be strings")
    _require(isinstance(config.azure, bool), "azure must be true/false")
    _require(isinstance(config.prompt_cache, bool), "prompt_cache must be true/false")
    _require(
        _is_number(config.token_lifetime) and config.token_lifetime > 0,
        "token_lifetime must be > 0",
    )
    _require(
        bool(config.azure_api_versions)
        and all(isinstance(v, str) and v for v in config.azure_api_versions),
        "azure_api_versions must be non-empty strings",
    )


def _check_json_type(name: str, value: object) -> None:
    """Reject JSON types the dataclass would silently accept (e.g. `true` for a rate)."""
    if name == "latency" or value is None:
        return
    if name == "api_key":
        _require(isinstance(value, str), "api_key must be a string or null")
    elif name in ("ratelimit_headers", "prompt_cache"):
        _require(isinstance(value, bool), f"{name} must be true or false")
    else:
        _require(_is_number(value), f"{name} must be a number")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
