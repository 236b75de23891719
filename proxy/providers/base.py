"""What a provider is: one upstream dialect the proxy speaks (pure).

A provider knows what depends on who answers, whatever the API shape: where each shape
is served (URLs from a deployment's config), the header that carries the deployment's key,
which shapes it speaks, how its answers announce their rate limits, how its limits count
each kind of token (``counting``), and how it says that the deployment's own config is
wrong. The registry (``proxy/providers/__init__.py``) maps the config's ``provider``
names to providers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from proxy.config import Deployment
    from proxy.costs import Counting
    from proxy.limiter.base import Outcome
    from proxy.upstream.ratelimits import UpstreamBudget

__all__ = ["Provider"]


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
        """The header carrying the deployment's key (name, value); None without a key."""
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
