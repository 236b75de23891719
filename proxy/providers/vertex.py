"""Google Vertex AI: publisher models under
``{base_url}/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/``
with a bearer token from google-auth (``google_token``), Google's errors (pure but for
the token).

- Anthropic's models (the ``messages`` shapes, Anthropic's Messages API as Claude Code
  and the ``anthropic`` SDK send it): ``{model}:rawPredict``, streamed
  ``{model}:streamRawPredict`` (server-sent events, as Anthropic's); the body without
  ``model`` and with ``anthropic_version: vertex-2023-10-16``
  (https://docs.claude.com/en/api/claude-on-vertex-ai); token counting at
  ``count-tokens:rawPredict``, the model kept in its body.
- Google's models (the Gemini API's shape, ``generateContent``, as Google's SDKs send
  it): ``{model}:generateContent``, streamed ``{model}:streamGenerateContent?alt=sse``
  (server-sent events whose lines end in CRLF, as the Gemini API's: made LF, ``CrLf``);
  the body as the client sent it (the model is named in the path), its usage
  ``usageMetadata``.

Which one a deployment serves is its model's (``shapes_for``): a name starting with
``claude`` is Anthropic's, any other Google's.

``base_url`` defaults to the region's endpoint (``config.vertex_base_url``: the
``global`` region and the ``us``/``eu`` multi-regions have hosts of their own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from proxy.costs import Counting
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.limiter.base import Outcome
from proxy.providers.anthropic import ANTHROPIC_SHAPES
from proxy.providers.gemini import GEMINI_SHAPES, CrLf
from proxy.providers.google_errors import google_status, retry_delay
from proxy.providers.google_token import GoogleToken
from proxy.providers.ratelimits import UpstreamBudget

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.providers.base import Wire
    from proxy.providers.framing import Reframer

__all__ = ["VERTEX", "VERTEX_COUNTING", "VERTEX_SHAPES", "VERTEX_VERSION", "VertexWire"]

# The ``anthropic_version`` Vertex AI takes in an Anthropic model's body.
VERTEX_VERSION = "vertex-2023-10-16"
# The Gemini API's shape (proxy/shapes/gemini.py), served by Google's publisher models.
GENERATE_CONTENT = "generateContent"
VERTEX_SHAPES = ANTHROPIC_SHAPES | GEMINI_SHAPES
# Vertex AI's Anthropic model IDs all start so (``claude-sonnet-4-5@20250929``); a
# pattern group's name too (``claude-*``).
_ANTHROPIC_PREFIX = "claude"
# The only characters of a model's name sent as they are in its path segment: what
# Vertex's model IDs use (``claude-sonnet-4-5@20250929``); anything else is escaped, so
# a client's name (a pattern group's) can never reach another path or a query.
_MODEL_SAFE = "@"

# How Vertex AI's quotas count (https://cloud.google.com/vertex-ai/generative-ai/docs/
# partner-models/claude/quotas): requests, input tokens and output tokens per minute per
# base model and region, apart (Gemini's: requests and tokens per minute per base model,
# or a shared pool that answers 429 when busy, https://cloud.google.com/vertex-ai/
# generative-ai/docs/quotas). Google says neither whether a prompt-cache read counts
# as input nor whether an output charge made at admission is given back: counted as the
# stricter reading (cache reads count, nothing given back), the proxy never sends more
# than a quota takes; a deployment's windows may be set a little higher to use it whole.
VERTEX_COUNTING = Counting(cache_reads=True, adjusted=False)

_NONE = UpstreamBudget()  # Vertex AI announces no budget in its headers
_NOT_FOUND = b'"NOT_FOUND"'


class VertexWire:
    """One Vertex AI deployment's URLs, bodies and bearer token."""

    stream_type = "text/event-stream"

    def __init__(self, deployment: Deployment, token: GoogleToken) -> None:
        self._publishers = (
            f"{deployment.base_url}/v1/projects/{deployment.project}"
            f"/locations/{deployment.region}/publishers"
        )
        self._token = token

    @property
    def token(self) -> GoogleToken:
        return self._token

    def outgoing(
        self, shape: str, model: str | None, stream: bool, payload: bytes
    ) -> tuple[str, bytes]:
        body = _object(payload)
        name = model if model is not None else body.get("model")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("'model' must name a model.", code="invalid_type", param="model")
        if shape == "messages/count_tokens":  # the model stays in its body
            url = f"{self._publishers}/anthropic/models/count-tokens:rawPredict"
            return url, _dumps({**body, "model": name, "anthropic_version": VERTEX_VERSION})
        body.pop("model", None)
        segment = quote(name, safe=_MODEL_SAFE)
        if shape in ANTHROPIC_SHAPES:
            method = "streamRawPredict" if stream else "rawPredict"
            url = f"{self._publishers}/anthropic/models/{segment}:{method}"
            return url, _dumps({**body, "anthropic_version": VERTEX_VERSION})
        if shape == GENERATE_CONTENT:
            method = "streamGenerateContent?alt=sse" if stream else "generateContent"
            return f"{self._publishers}/google/models/{segment}:{method}", _dumps(body)
        raise InvalidRequest(f"Vertex AI does not serve the '{shape}' API.", code="unsupported_api")

    async def authorize(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        headers["authorization"] = f"Bearer {await self._token.bearer()}"

    async def ready(self) -> None:
        """The first token fetched (``Readies``): a turn is never spent waiting for it."""
        with contextlib.suppress(UpstreamUnavailable):  # authorize reports it
            await self._token.bearer()

    def reframer(self) -> Reframer | None:
        # Google's front ends end event lines in CRLF (as the Gemini API's): made LF for
        # the shapes' readers. A stream of LF lines (Anthropic's events) passes as it is.
        return CrLf()


def _object(payload: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):  # the shape validated it: only a translation's bug
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    return body


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes
        raise InvalidRequest("The request is nested too deeply.", code="invalid_type") from None


class Vertex:
    name = "vertex"
    shapes = VERTEX_SHAPES
    counting = VERTEX_COUNTING
    # Vertex takes the API version in the body (``VERTEX_VERSION``), not as a header.
    default_headers: tuple[tuple[str, str], ...] = ()

    def shapes_for(self, model: str) -> frozenset[str]:
        """``ShapesByModel``: Anthropic's models the Messages API, Google's (any other
        name) ``generateContent``; a request of the other API never reaches the
        deployment (its 404 would cool it)."""
        if model.lower().startswith(_ANTHROPIC_PREFIX):
            return ANTHROPIC_SHAPES
        return GEMINI_SHAPES

    def url(self, deployment: Deployment, shape: str) -> str:
        """Where a request of the deployment's own model goes (what a probe or a log
        shows; each request's URL is its wire's, its model's)."""
        model = quote(deployment.model or "-", safe=_MODEL_SAFE)
        publisher = "google" if shape == GENERATE_CONTENT else "anthropic"
        base = f"{deployment.base_url}/v1/projects/{deployment.project}"
        return f"{base}/locations/{deployment.region}/publishers/{publisher}/models/{model}"

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        return None  # the deployment's model, as configured (its wire moves it to the URL)

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        return None  # a bearer token, added over each request by its wire

    def wire(self, deployment: Deployment) -> Wire | None:
        return VertexWire(deployment, GoogleToken(deployment.id, deployment.credentials_file))

    def throttled(self, body: bytes) -> float | None:
        """A 429's ``RetryInfo`` (``ThrottleInBody``): Vertex sends no retry-after."""
        return retry_delay(body)

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        return _NONE

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """Its project, region and model come from the config: a Google ``NOT_FOUND``
        (no such project, location or publisher model) is never the client's fault,
        unless the model was the client's own name (``asked``). Its 401 and 403
        (``UNAUTHENTICATED``, ``PERMISSION_DENIED``: the service account's role) are a
        bad credential, cooled as any upstream's are (outcomes)."""
        if status != 404 or asked or _NOT_FOUND not in body[:1024]:
            return None
        if google_status(body[:65536]) != "NOT_FOUND":
            return None
        return Outcome(kind="failure", reason="misconfigured", cool_for=cooldown_time)


VERTEX = Vertex()
