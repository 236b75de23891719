"""Google's Gemini API, as its SDKs call it: ``POST /v1beta/models/{model}:generateContent``
and ``:streamGenerateContent?alt=sse`` (``/v1/`` too), plain and streamed (pure).

The model and the stream flag are in the URL, not the body; the key comes as
``x-goog-api-key``, ``?key=`` or a bearer token; the output cap is
``generationConfig.maxOutputTokens`` (for each of ``generationConfig.candidateCount``
candidates). Usage is ``usageMetadata`` (https://ai.google.dev/api/generate-content#UsageMetadata):
``promptTokenCount`` is the whole prompt, ``cachedContentTokenCount`` the part of it
read from a cache, ``toolUsePromptTokenCount`` the tool results read besides it;
``candidatesTokenCount`` what the candidates hold and ``thoughtsTokenCount`` a thinking
model's thoughts, both generated (and billed) output. Errors take Google's shape,
``{"error": {"code", "message", "status"}}``, a 429 ``RESOURCE_EXHAUSTED`` with a
``RetryInfo`` detail (``retryDelay``), and an ``ErrorInfo`` whose ``reason`` is the
proxy's error code (whose limit it was). The client key's limits go as OpenAI's
``x-ratelimit-*`` headers (Google sends none of its own).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import orjson

from proxy.costs import Cost, NoCount, TokenUsage, estimate_cost, usage_count
from proxy.errors import InvalidRequest, ModelNotFound, ProxyError
from proxy.shapes.base import AS_SENT, Prepared, RequestTarget
from proxy.shapes.credentials import bearer_secret
from proxy.shapes.openai import key_headers
from proxy.shapes.output_caps import OutputCaps
from proxy.shapes.tokens import PER_MESSAGE, PER_REQUEST, text_tokens
from proxy.values import value

if TYPE_CHECKING:
    from proxy.shapes.cache_prefixes import CachePrefixes

__all__ = ["GENERATE_CONTENT", "GOOGLE_KEY", "GeminiStreamUsage", "google_status", "usage_of"]

_GENERATE = "generateContent"
_STREAM = "streamGenerateContent"

# Google's canonical status per HTTP status (google.rpc.Code's mapping); any other 4xx is
# about the request, any other 5xx the service's.
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"

CAPS = OutputCaps(
    sent=("generationConfig", "maxOutputTokens"),
    carriers=(("generationConfig", "maxOutputTokens"),),
    count=("generationConfig", "candidateCount"),
)


def google_status(status: int) -> str:
    return _STATUSES.get(status) or ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def error_body(error: ProxyError) -> bytes:
    """Google's error shape; a refusal that says when to retry carries it as a
    ``RetryInfo`` (whole seconds, rounded up: the SDKs wait that long)."""
    details: list[dict[str, Any]] = [
        {"@type": _ERROR_INFO, "reason": error.code or "", "domain": "llm-proxy"}
    ]
    if error.retry_after is not None:
        delay = max(math.ceil(error.retry_after), 0)
        details.append({"@type": _RETRY_INFO, "retryDelay": f"{delay}s"})
    status = error.status
    return orjson.dumps(
        {
            "error": {
                "code": status,
                "message": error.message,
                "status": google_status(status),
                "details": details,
            }
        }
    )


def stream_error(message: str) -> bytes:
    """The event a broken stream ends with: Google's error object as a data event (its
    SDKs raise an error an event carries)."""
    payload = {"error": {"code": 500, "message": message, "status": "INTERNAL"}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage_of(metadata: object) -> TokenUsage | None:
    """A ``usageMetadata`` object's counts (None: it states neither prompt nor
    candidates, or one of its counts is no count: ``usage_count``)."""
    if not isinstance(metadata, dict):
        return None
    try:
        prompt, made, cached, tools, thoughts = (
            usage_count(metadata.get(name))
            for name in (
                "promptTokenCount",
                "candidatesTokenCount",
                "cachedContentTokenCount",
                "toolUsePromptTokenCount",
                "thoughtsTokenCount",
            )
        )
    except NoCount:
        return None
    if prompt is None and made is None:
        return None
    given = (prompt or 0) + (tools or 0)
    return TokenUsage(
        input_tokens=given,
        output_tokens=(made or 0) + (thoughts or 0),
        cached_input=min(cached or 0, prompt or 0),  # part of the prompt, never more
    )


def _usage_of_body(content: bytes) -> TokenUsage | None:
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return usage_of(payload.get("usageMetadata")) if isinstance(payload, dict) else None


class GeminiStreamUsage:
    """A stream's usage: each event's ``usageMetadata`` counts so far (the last one's
    are final). Known once an event has ended a candidate (``finishReason``): a stream
    cut before that is charged as a stream without usage is, not its partial counts."""

    markers = (b'"usageMetadata"',)
    ends = (b'"finishReason"',)

    def __init__(self) -> None:
        self._usage: TokenUsage | None = None
        self._final = False

    def record(self, payload: dict[str, Any]) -> None:
        if "usageMetadata" in payload:
            self._usage = usage_of(payload["usageMetadata"])
        candidates = payload.get("candidates")
        if isinstance(candidates, list):
            self._final = self._final or any(
                isinstance(c, dict) and c.get("finishReason") for c in candidates
            )

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        return False  # the API always reports usage: the proxy adds nothing

    @property
    def usage(self) -> TokenUsage | None:
        return self._usage if self._final else None


@value
class GoogleKey:
    """``x-goog-api-key: KEY`` (Google's SDKs), else a bearer token, else ``?key=KEY``."""

    headers: tuple[str, ...] = ("x-goog-api-key", "authorization")
    query: tuple[str, ...] = ("key",)
    missing: str = "Missing API key: send 'x-goog-api-key: YOUR_KEY' or '?key=YOUR_KEY'."

    def secret(self, header: str, value: str | None) -> str | None:
        if header == "authorization":
            return bearer_secret(value)
        secret = (value or "").strip()
        return secret or None


GOOGLE_KEY = GoogleKey()


def _invalid(param: str, expected: str) -> None:
    raise InvalidRequest(f"Invalid '{param}': expected {expected}.", param=param)


def _positive(config: dict[str, Any], name: str) -> None:
    found = config.get(name)
    if found is not None and (type(found) is not int or found < 1):
        _invalid(f"generationConfig.{name}", "a positive integer")


def _parts(contents: list[Any]) -> list[Any]:
    """The parts of ``contents`` (``{"text": ...}``, an image's ``inlineData``...), as
    ``text_tokens`` reads them; a content given as a string is its text."""
    return [c.get("parts") if isinstance(c, dict) else c for c in contents]


class GenerateContent:
    """The Gemini API's ``generateContent``, plain and streamed."""

    name = "generateContent"
    paths = (
        "/v1beta/models/{model}:{method}",
        "/v1/models/{model}:{method}",
    )
    credential = GOOGLE_KEY
    stores_responses = False
    output_caps = CAPS

    def model_of(self, body: dict[str, Any], target: RequestTarget) -> object:
        return target.params.get("model")

    def streamed(self, body: dict[str, Any], target: RequestTarget) -> bool:
        method = target.params.get("method")
        if method == _GENERATE:
            return False
        if method != _STREAM:  # countTokens, embedContent...: not served here
            raise ModelNotFound(
                f"The method '{str(method)[:100]}' is not served by this proxy.",
                code="unknown_url",
            )
        if target.arg("alt") != "sse":
            raise InvalidRequest(
                "Streams are served as server-sent events only: add '?alt=sse'.", param="alt"
            )
        return True

    def check(self, body: dict[str, Any]) -> None:
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            _invalid("contents", "a non-empty array of contents")
        config = body.get("generationConfig")
        if config is not None:
            if not isinstance(config, dict):
                _invalid("generationConfig", "an object")
            _positive(config, "maxOutputTokens")
            _positive(config, "candidateCount")
        system = body.get("systemInstruction")
        if system is not None and not isinstance(system, dict | str):
            _invalid("systemInstruction", "a content")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            _invalid("tools", "an array of tools")

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        contents = body["contents"]  # checked
        prompt = PER_REQUEST + PER_MESSAGE * len(contents) + text_tokens(_parts(contents))
        system = body.get("systemInstruction")
        if system is not None:
            prompt += PER_MESSAGE + text_tokens(_parts([system]))
        if "tools" in body:  # a tool's schema is read by its JSON's size
            prompt += len(orjson.dumps(body["tools"])) // 4
        config = body.get("generationConfig") or {}
        cap = config.get("maxOutputTokens") or default_output
        return estimate_cost(prompt, cap * (config.get("candidateCount") or 1))

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        return None  # its implicit cache is automatic; its limits count what it reads

    def prepare(self, body: dict[str, Any], stream: bool) -> Prepared:
        return AS_SENT  # usage comes with every answer

    usage = staticmethod(_usage_of_body)

    def stream_usage(self) -> GeminiStreamUsage:
        return GeminiStreamUsage()

    error_body = staticmethod(error_body)
    stream_error = staticmethod(stream_error)
    key_headers = staticmethod(key_headers)


GENERATE_CONTENT = GenerateContent()
