"""What a provider is: one upstream dialect the proxy speaks (pure).

A provider knows what depends on who answers, whatever the API shape: where each shape
is served (URLs from a deployment's config), the header that carries the deployment's key,
which shapes it speaks, how its answers announce their rate limits, how its limits count
each kind of token (``counting``), and how it says that the deployment's own config is
wrong. The registry (``proxy/providers/__init__.py``) maps the config's ``provider``
names to providers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from proxy.config.settings import Deployment
    from proxy.costs import Counting
    from proxy.limiter.base import Outcome
    from proxy.providers.framing import Reframer
    from proxy.providers.ratelimits import UpstreamBudget

__all__ = ["HeadersInBody", "Provider", "ShapesByModel", "ThrottleInBody", "Wire"]


class Wire(Protocol):
    """How one deployment's requests differ on the wire from the common case (the shape's
    JSON POSTed to a fixed URL under a static key header): the model or the stream flag in
    the URL, fields its body adds or drops, credentials over the final request (a SigV4
    signature, a token refreshed before it expires), a stream framed otherwise than as
    server-sent events. Made once per deployment (``Provider.wire``); it may hold state
    (a token and its expiry), never the client's."""

    @property
    def stream_type(self) -> str:
        """The content type its streamed answers come in (``text/event-stream``)."""
        ...

    def outgoing(
        self, shape: str, model: str | None, stream: bool, payload: bytes
    ) -> tuple[str, bytes]:
        """The URL and the body sent for a request of the shape named ``shape`` whose JSON
        body is ``payload`` (its model already set), for ``model`` (the deployment's, else
        the client's; None: the client's, as in ``payload``), streamed or not. Raises
        ``errors.InvalidRequest`` for a body it cannot send."""
        ...

    async def authorize(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        """Adds its credentials to ``headers`` in place, over the request as it will be
        sent. Raises ``errors.UpstreamUnavailable`` when it cannot get them (a token
        endpoint down): the deployment is not reachable."""
        ...

    def reframer(self) -> Reframer | None:
        """A new streamed answer's reframer; None: it streams server-sent events."""
        ...


@runtime_checkable
class Readies(Protocol):
    """A wire whose credentials take a first fetch (a token from its endpoint, AWS's
    credential chain): the dispatcher awaits ``ready`` before it asks for a turn, so no
    turn is spent waiting for them (a turn sent that late would break the pacing).
    Optional: a wire without it is ready at once."""

    async def ready(self) -> None:
        """Returns once its credentials are at hand, or once getting them failed (the
        failure is ``authorize``'s to report); at once after the first time."""
        ...


@runtime_checkable
class HeadersInBody(Protocol):
    """A wire whose upstream takes some of the client's headers as fields of the body
    instead (Bedrock's InvokeModel: ``anthropic-beta`` as ``anthropic_beta``). Optional:
    a wire without it sends the client's headers as headers only."""

    def carried(
        self, shape: str, client_headers: Iterable[tuple[str, str]], payload: bytes
    ) -> bytes:
        """``payload`` (the body ``outgoing`` made) with what ``client_headers`` say that
        the body carries (unchanged when they say nothing of it). Raises
        ``errors.InvalidRequest`` for a body field it cannot merge them into."""
        ...


@runtime_checkable
class ThrottleInBody(Protocol):
    """A provider whose 429 says in its body, not its headers, when to retry (the Gemini
    API's ``RetryInfo``): its body is read (bounded) and the wait it says taken as a
    ``retry-after`` is. Optional: a provider without it is not asked."""

    def throttled(self, body: bytes) -> float | None:
        """Seconds the 429's ``body`` asks to wait (read strictly, bounded); None: it
        says none."""
        ...


@runtime_checkable
class ShapesByModel(Protocol):
    """A provider whose deployments each serve some of its ``shapes``, as the model they
    serve decides (Vertex AI: Anthropic's models the Messages API, Google's
    ``generateContent``): a deployment offers no API its model cannot answer, so no
    client's request of another API reaches it (and cools it on a 404). Optional: a
    provider without it serves all its shapes on every deployment."""

    def shapes_for(self, model: str) -> frozenset[str]:
        """The shapes a deployment of ``model`` serves (the deployment's ``model``, else
        its group's name, a pattern's included)."""
        ...


class Provider(Protocol):
    """One upstream dialect. Implementations are stateless singletons, registered once."""

    @property
    def name(self) -> str:
        """Its name in the config (``provider:``)."""
        ...

    @property
    def shapes(self) -> frozenset[str]:
        """The names of the API shapes its deployments serve (``Shape.name``)."""
        ...

    @property
    def default_headers(self) -> tuple[tuple[str, str], ...]:
        """Headers sent when the client sends none of that name (Anthropic's
        ``anthropic-version``)."""
        ...

    @property
    def counting(self) -> Counting:
        """How its rate limits count tokens (cache reads, the output cap at admission,
        what the answer corrects): its deployments' windows count the same."""
        ...

    def url(self, deployment: Deployment, shape: str) -> str:
        """Where ``deployment`` serves the shape named ``shape`` (one of ``shapes``)."""
        ...

    def body_model(self, deployment: Deployment, shape: str) -> str | None:
        """The ``model`` the forwarded body names for ``shape`` when the provider decides
        it (Azure's Responses API: the Azure deployment's name); None: the deployment's
        ``model`` (or its group's name)."""
        ...

    def credential(self, deployment: Deployment) -> tuple[str, str] | None:
        """The header carrying the deployment's key (name, value); None without a key, or
        when its ``wire`` adds the credentials."""
        ...

    def wire(self, deployment: Deployment) -> Wire | None:
        """The deployment's ``Wire`` when its requests need one (made once); None: the
        shape's JSON POSTed to ``url`` with ``credential``."""
        ...

    def budget(self, headers: Mapping[str, str], now: float) -> UpstreamBudget:
        """What an answer's headers say of the upstream's budget (``now``: epoch)."""
        ...

    def misconfigured(
        self, status: int, body: bytes, cooldown_time: float, asked: bool = False
    ) -> Outcome | None:
        """An answer that says the deployment's own config is wrong (cooled as a bad key
        is, for ``cooldown_time``); None: an ordinary answer. ``asked``: the body's
        ``model`` was the client's own name (a pattern group's deployment without
        ``model:``), so an answer about the model is about the client's request."""
        ...
