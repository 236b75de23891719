"""What Anthropic's API shapes share (pure): usage as Anthropic reports it (plain and
streamed), its error body and stream error event, its key (``x-api-key`` or bearer), and
the client key's limits as ``anthropic-ratelimit-*`` headers.

The Messages API (``messages.py``) and its token counting (``count_tokens.py``) are
built on these. Usage splits input three ways: ``input_tokens`` (uncached),
``cache_creation_input_tokens`` (written to the cache) and ``cache_read_input_tokens``.
What counts toward an input-token limit is the first two (Anthropic's rule for current
models: cache reads do not count, docs/limiter.md), so ``TokenUsage.input_tokens`` is
their sum and ``cache_read`` stands apart. A count of a name the proxy does not know
(``usage.*_tokens``, an integer) is counted, not dropped: by its name as output
(``output``), a cache read (``cache_read``) or else input (``unknown_counts``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from proxy.costs import MAX_COUNT, Cost, NoCount, TokenUsage, usage_count
from proxy.errors import InvalidRequest, ProxyError
from proxy.shapes.base import AS_SENT, BodyRequest, ClientCredential, Prepared, StreamUsage
from proxy.shapes.credentials import ANTHROPIC_KEY
from proxy.shapes.openai_fields import check_messages, check_stream, invalid

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict, Kind
    from proxy.shapes.cache_prefixes import CachePrefixes
    from proxy.shapes.output_caps import OutputCaps

__all__ = [
    "AnthropicShape",
    "AnthropicStreamUsage",
    "check_fields",
    "error_body",
    "error_type",
    "key_headers",
    "stream_error",
    "usage_of",
]

# Anthropic's error ``type`` per HTTP status (its API's list); any other 4xx is about the
# request, any other 5xx the API's.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # the proxy has no deployment to give: overloaded, retry
    504: "timeout_error",
    529: "overloaded_error",
}

# The counts a usage object holds (message_start's, message_delta's, a message's).
_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)

# The client key's limit kinds, as Anthropic's headers name them.
_HEADER_KINDS: tuple[tuple[Kind, str], ...] = (
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input_tokens", "input-tokens"),
    ("output_tokens", "output-tokens"),
)


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(error: ProxyError) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}``: Anthropic's shape, the same
    status (and retry-after) as on the OpenAI surface."""
    return orjson.dumps(
        {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}
    )


def stream_error(message: str) -> bytes:
    """The ``error`` event Anthropic ends a broken stream with (its SDKs raise it)."""
    payload = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
    return b"event: error\ndata: " + payload + b"\n\n"


def usage_of(usage: object) -> TokenUsage | None:
    """A usage object's counts (None: it states neither input nor output, or one of its
    counts is no count: ``usage_count``), those of names it does not know included."""
    if not isinstance(usage, dict):
        return None
    try:
        given, output, write, read = (usage_count(usage.get(name)) for name in _COUNTS)
    except NoCount:
        return None
    if given is None and output is None:
        return None
    more_input, more_output, more_read = unknown_counts(usage)
    return TokenUsage(
        input_tokens=(given or 0) + (write or 0) + more_input,
        output_tokens=(output or 0) + more_output,
        cache_read=(read or 0) + more_read,
        cache_write=write or 0,
    )


def unknown_counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    """The counts of ``usage`` the proxy does not know, as (input, output, cache read):
    a top-level ``*_tokens`` integer of another name is tokens Anthropic counted, added
    where its name says (``output``: output; ``cache_read``: read from the cache, which
    its input limit does not count) and otherwise to the input, which its input limit
    counts (on the safe side: a new kind of input is paid for, not assumed free). Nested
    objects are breakdowns of the known counts (``cache_creation``'s split by lifetime)
    or no tokens (``server_tool_use``'s requests), and are not added; a value that is no
    integer adds nothing, nor does a negative one."""
    given = made = read = 0
    for name, value in usage.items():
        if name in _COUNTS or not name.endswith("_tokens") or type(value) is not int:
            continue
        count = min(max(value, 0), MAX_COUNT)
        if "output" in name:
            made += count
        elif "cache_read" in name:
            read += count
        else:
            given += count
    return given, made, read


def usage_of_body(content: bytes) -> TokenUsage | None:
    """The ``usage`` of a buffered message (None where it has none)."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return usage_of(payload.get("usage")) if isinstance(payload, dict) else None


class AnthropicStreamUsage:
    """A stream's usage: ``message_start`` carries the input counts (and an output count
    of 1 or so), ``message_delta`` the final ones. Known only once ``message_delta`` came:
    a stream cut before it is charged as a stream without usage is (at least its
    estimate), not the start's partial count."""

    markers = (b'"usage"',)
    ends = (b"message_stop",)

    def __init__(self) -> None:
        self._counts: dict[str, Any] = {}
        self._final = False

    def record(self, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        elif kind == "message_delta":
            usage = payload.get("usage")
            self._final = self._final or isinstance(usage, dict)
        else:
            return
        if isinstance(usage, dict):  # later counts replace earlier ones (they add up)
            self._counts.update(
                (k, v) for k, v in usage.items() if v is not None and k.endswith("_tokens")
            )

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return False  # the API always reports usage: the proxy adds nothing

    @property
    def usage(self) -> TokenUsage | None:
        return usage_of(self._counts) if self._final else None


def key_headers(verdict: KeyVerdict, now: float) -> dict[str, str]:
    """The client key's limits as Anthropic's ``anthropic-ratelimit-*`` headers (resets as
    RFC 3339 times); of several windows of a kind, the one with the least left."""
    headers: dict[str, str] = {}
    for kind, name in _HEADER_KINDS:
        usage = verdict.tightest(kind)
        if usage is None:
            continue
        prefix = f"anthropic-ratelimit-{name}"
        headers[f"{prefix}-limit"] = str(int(usage.limit))
        headers[f"{prefix}-remaining"] = str(max(int(usage.remaining), 0))
        headers[f"{prefix}-reset"] = rfc3339(now + max(usage.reset, 0.0))
    return headers


def rfc3339(moment: float) -> str:
    """An epoch time as RFC 3339 in UTC, whole seconds rounded up (a client waiting for
    it never resumes early)."""
    whole = int(moment) + (moment % 1 > 0)
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_fields(body: dict[str, Any], *, max_tokens: bool) -> None:
    """The fields the proxy reads, of the shape it reads them in (400 naming them):
    ``stream``, ``messages``, ``system``, ``tools`` and (``max_tokens``: required, as the
    Messages API requires it) ``max_tokens``."""
    check_stream(body)
    if max_tokens:
        value = body.get("max_tokens")
        if value is None:
            raise InvalidRequest(
                "'max_tokens' is required.", code="missing_required_parameter", param="max_tokens"
            )
        if type(value) is not int or value < 1:
            invalid("max_tokens", "a positive integer")
    check_messages(body)
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        invalid("system", "a string or an array of text blocks")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        invalid("tools", "an array of tools")


class AnthropicShape(BodyRequest):
    """An Anthropic API shape: a key as ``x-api-key`` or bearer, usage as Anthropic
    reports it (never asked for: it always reports), errors in Anthropic's shape. A
    subclass names its paths, checks and estimates."""

    name: str = ""
    paths: tuple[str, ...] = ()
    credential: ClientCredential = ANTHROPIC_KEY
    stores_responses = False
    output_caps: OutputCaps | None = None

    def check(self, body: dict[str, Any]) -> None:
        check_fields(body, max_tokens=False)

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        raise NotImplementedError

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        return None

    def prepare(self, body: dict[str, Any], stream: bool) -> Prepared:
        return AS_SENT

    def usage(self, content: bytes) -> TokenUsage | None:
        return usage_of_body(content)

    def stream_usage(self) -> StreamUsage:
        return AnthropicStreamUsage()

    def error_body(self, error: ProxyError) -> bytes:
        return error_body(error)

    def stream_error(self, message: str) -> bytes:
        return stream_error(message)

    key_headers = staticmethod(key_headers)
