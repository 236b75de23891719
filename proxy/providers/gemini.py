"""The Gemini API (Google AI Studio): ``{base_url}/v1beta/models/{model}:generateContent``
and ``:streamGenerateContent?alt=sse``, the key as ``x-goog-api-key``, no rate-limit
headers, its 429 ``RESOURCE_EXHAUSTED`` telling when to retry in its body
(``RetryInfo.retryDelay``, ``"38s"``), its way of counting tokens toward its limits
(pure).

Its streams are server-sent events whose lines may end in CRLF: they reach the shape's
reader (and the client) with LF line ends (``CrLf``), as every reader of events here
splits them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote

from proxy.costs import Counting
from proxy.errors import InvalidRequest
from proxy.limiter.base import Outcome
from proxy.providers.google_errors import MAX_RETRY_DELAY, retry_delay
from proxy.providers.ratelimits import UpstreamBudget, parse_budget

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.providers.base import Wire
    from proxy.providers.framing import Reframer

__all__ = ["GEMINI", "GEMINI_COUNTING", "GEMINI_SHAPES", "MAX_RETRY_DELAY", "retry_delay"]

GEMINI_SHAPES = frozenset(("generateContent",))

# How the Gemini API's limits count a request, https://ai.google.dev/gemini-api/docs/rate-limits:
# requests per minute and per day, and "tokens per minute (input)": its TPM counts the
# prompt, not the output. The prompt is `usageMetadata.promptTokenCount`, which "when
# cachedContent is set ... still is the total effective prompt size meaning this includes
# the number of tokens in the cached content" (https://ai.google.dev/api/generate-content#UsageMetadata,
# `cachedContentTokenCount` its cached part): no page says cached tokens are left out of
# the limit, so they count (cache_reads). Google documents no adjustment of what a request
# was charged at admission, so the proxy's estimate stands and a request is charged more
# only when its usage says more (not adjusted), as for OpenAI. `thoughtsTokenCount` (a
# thinking model's thoughts) and `candidatesTokenCount` are output (shapes/gemini.py).
GEMINI_COUNTING = Counting(cache_reads=True, adjusted=False)

_KEY_INVALID = b"API_KEY_INVALID"


class CrLf:
    """A stream's CRLF line ends made LF (a CR at a chunk's end waits for the next)."""

    def __init__(self) -> None:
        self._cr = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        if data:
            yield data.replace(b"\r\n", b"\n")

    def end(self) -> None:
        self._cr = False  # a lone CR at the end: nothing follows it


class GeminiWire:
    """The model and the method in the URL; the shape's body as it is."""

    stream_type = "text/event-stream"

    def __init__(self, base_url: str) -> None:
        self._models = f"{base_url}/v1beta/models/"

    def outgoing(
        self, shape: str, model: str | None, stream: bool, payload: bytes
    ) -> tuple[str, bytes]:
        if not model:
            raise InvalidRequest("The Gemini API needs a model.", param="model")
        method = ":streamGenerateContent?alt=sse" if stream else ":generateContent"
        # The name may be the client's (a pattern group's): escaped, never a path.
        return self._models + quote(model, safe="-._~") + method, payload

    async def authorize(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        return None  # a static key: ``credential``

    def reframer(self) -> Reframer | None:
        return CrLf()


class Gemini:
    name = "gemini"
    shapes = GEMINI_SHAPES
    counting = GEMINI_COUNTING
    default_headers: tuple[tuple[str, str], ...] = ()

    def url(self, deployment: Deployment, shape: str) -> str:
        return f"{deployment.base_url}/v1beta/models"  # the model and method: ``wire``

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None  # the deployment's model, as configured (in the URL)

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        key = deployment.api_key.get_secret_value()
        return ("x-goog-api-key", key) if key else None

    def wire(self, deployment: Deployment) -> Wire | None:
        return GeminiWire(deployment.base_url)

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return parse_budget(headers, now)  # none of its own: a retry-after, if any

    @staticmethod
    def throttled(body: bytes) -> float | None:
        return retry_delay(body)

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """A key Google says is not valid (400 ``API_KEY_INVALID``, not 401) is the
        config's fault, cooled as a bad key is; so is a 404 for the deployment's own
        model (not the client's name: ``asked``)."""
        head = body[:2048]
        if status == 400 and _KEY_INVALID in head:
            return Outcome(kind="failure", reason="auth", cool_for=cooldown_time)
        if status == 404 and not asked and b"NOT_FOUND" in head:
            return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)
        return None


GEMINI = Gemini()
