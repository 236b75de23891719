"""What an API shape is: one request format the proxy serves (pure).

A shape knows everything about its requests and answers that is not about routing or an
upstream's dialect: the client paths it is served at, the fields the proxy reads (checked
first), what a request costs before it is sent, what the forwarded body needs (usage in
streams), the real usage of a plain answer and of a stream, its error body and stream error
event, and how a client presents its key. The registry (``proxy/shapes/__init__.py``) maps
paths to shapes; a provider (``proxy/providers/``) says where each shape is served upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

from proxy.costs import Cost, TokenUsage
from proxy.errors import InvalidRequest, ProxyError
from proxy.values import value

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict
    from proxy.shapes.cache_prefixes import CachePrefixes
    from proxy.shapes.output_caps import OutputCaps

__all__ = [
    "AS_SENT",
    "AT_PATH",
    "BodyRequest",
    "ClientCredential",
    "Prepared",
    "RequestTarget",
    "Shape",
    "StreamUsage",
    "api_label",
]


def api_label(shape: str) -> str:
    """The API a request came through, as the ``api`` metric label and log field: its
    shape's name as one word (``chat_completions``, ``responses``, ``messages``...).
    The one place it is spelled; shape names are the proxy's, never a client's."""
    return shape.replace("/", "_")


@value
class RequestTarget:
    """What a request's URL says beyond its shape: the values a path template's
    placeholders matched (``{"model": "gemini-2.5-flash"}`` for
    ``/v1beta/models/{model}:generateContent``) and its query string, as sent."""

    params: Mapping[str, str]
    query: str = ""

    def arg(self, name: str) -> str | None:
        """The query parameter ``name``'s value (None: absent); given twice, a 400 (which
        one counts would be ambiguous between the proxy and what stands before it)."""
        if name not in self.query:  # the usual case: no query, or not this one
            return None
        found = [v for k, v in parse_qsl(self.query, keep_blank_values=True) if k == name]
        if len(found) > 1:
            raise InvalidRequest(
                f"Send the query parameter '{name}' once, not several times.",
                code=f"duplicate_{name}",
            )
        return found[0] if found else None


AT_PATH = RequestTarget({})  # a request at one of its shape's exact paths, no query


class ClientCredential(Protocol):
    """How a client presents its key to the proxy (the header and its scheme, or a query
    parameter)."""

    @property
    def headers(self) -> tuple[str, ...]:
        """The headers it may come in, lower case, the first present one counting:
        ``("authorization",)``."""
        ...

    @property
    def query(self) -> tuple[str, ...]:
        """The query parameters it may come in when no header carries it (Google's
        ``key``); empty: none. Never logged, never forwarded."""
        ...

    @property
    def missing(self) -> str:
        """What a request without it is told."""
        ...

    def secret(self, header: str, value: str | None) -> str | None:
        """The key in the value of ``header`` (one of ``headers`` or ``query``); None:
        none presented."""
        ...


class StreamUsage(Protocol):
    """What a shape reads of its stream's events as they pass (sse.UsageTap feeds it)."""

    @property
    def markers(self) -> tuple[bytes, ...]:
        """Bytes one of which an event that may hold usage contains."""
        ...

    @property
    def ends(self) -> tuple[bytes, ...]:
        """Bytes one of which the stream's last event contains: a client that leaves
        after reading it read the whole answer (the OpenAI SDK closes on ``[DONE]``)."""
        ...

    def record(self, payload: dict[str, Any]) -> None:
        """Read the usage a parsed event carries (events may add up, as Anthropic's do)."""
        ...

    def added_by_proxy(self, payload: dict[str, Any]) -> bool:
        """Whether ``payload`` is the usage-only event the proxy asked for (removed when
        the client did not ask for it)."""
        ...

    @property
    def usage(self) -> TokenUsage | None:
        """The usage read so far; None: none yet."""
        ...


@value
class Prepared:
    """What the forwarded body needs beyond the client's (``Shape.prepare``)."""

    changed: Mapping[str, Any]  # top-level fields to set (empty: the body goes as it is)
    strip_usage: bool = False  # the proxy asked the stream for usage the client did not


AS_SENT = Prepared({})


class Shape(Protocol):
    """One API shape. Implementations are stateless singletons, registered once."""

    @property
    def name(self) -> str:
        """Its label in metrics and logs, and the key of its URL at a provider."""
        ...

    @property
    def paths(self) -> tuple[str, ...]:
        """The client paths it is served at (POST). A ``{name}`` in one is a placeholder
        matching one or more characters up to the next ``/`` or ``:``
        (``/v1beta/models/{model}:generateContent``), handed to ``model_of`` and
        ``streamed`` as ``RequestTarget.params``."""
        ...

    @property
    def credential(self) -> ClientCredential:
        """How its clients present their key."""
        ...

    @property
    def stores_responses(self) -> bool:
        """Whether the upstream stores its answers, which later requests continue
        (follow_ups.py: the Responses API's ``previous_response_id``)."""
        ...

    @property
    def output_caps(self) -> OutputCaps | None:
        """Where its requests carry their output cap (None: they generate nothing)."""
        ...

    def model_of(self, body: dict[str, Any], target: RequestTarget) -> object:
        """The model the request asks for, as the client wrote it (checked by the
        pipeline: a non-empty string), from its body or its URL (``target``)."""
        ...

    def streamed(self, body: dict[str, Any], target: RequestTarget) -> bool:
        """Whether the request asks for a streamed answer (its body's flag, or its URL's
        method). Raises InvalidRequest for a stream it cannot serve."""
        ...

    def check(self, body: dict[str, Any]) -> None:
        """Raise InvalidRequest (naming the param) for a field the proxy reads whose
        shape is wrong."""
        ...

    def estimate(self, body: dict[str, Any], default_output: int) -> Cost:
        """What the request costs before the upstream counts: ``requests``, ``tokens``,
        ``input_tokens``, ``output_tokens`` (``default_output``: the output tokens of a
        request that sets no cap)."""
        ...

    def cache_prefixes(self, body: dict[str, Any], raw: bytes) -> CachePrefixes | None:
        """Where the upstream's prompt cache may serve the request, as the client marked
        it (``raw``: its bytes); None: nowhere the proxy can tell (an API whose cache is
        automatic counts what it reads, as OpenAI's does)."""
        ...

    def prepare(self, body: dict[str, Any], stream: bool) -> Prepared:
        """The fields the forwarded body needs changed (beyond ``model``)."""
        ...

    def usage(self, content: bytes) -> TokenUsage | None:
        """The usage a plain (buffered) answer reports; None: it cannot be read."""
        ...

    def stream_usage(self) -> StreamUsage:
        """A reader for one stream's usage."""
        ...

    def error_body(self, error: ProxyError) -> bytes:
        """The body of an error answer, in this API's error shape."""
        ...

    def stream_error(self, message: str) -> bytes:
        """The event that ends a stream broken off upstream, in this API's shape."""
        ...

    def key_headers(self, verdict: KeyVerdict, now: float) -> dict[str, str]:
        """The client key's limits as this API's rate-limit headers (``now``: epoch)."""
        ...


class BodyRequest:
    """The common case: the model is the body's ``model``, the stream flag its
    ``stream`` (OpenAI's and Anthropic's APIs)."""

    @staticmethod
    def model_of(body: dict[str, Any], target: RequestTarget) -> object:
        return body.get("model")

    @staticmethod
    def streamed(body: dict[str, Any], target: RequestTarget) -> bool:
        return body.get("stream") is True
