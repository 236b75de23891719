"""What the proxy knows about one request as it goes, and what it answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from proxy.costs import (
    INPUT_TOKENS,
    NOTHING,
    OUTPUT_TOKENS,
    TOKENS,
    Cost,
    TokenUsage,
    usage_cost,
)
from proxy.limiter.base import Claimant, Clamp
from proxy.shapes.base import AT_PATH, RequestTarget, Shape

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict
    from proxy.shapes.cache_prefixes import CachePrefixes
    from proxy.translate import Translations

__all__ = [
    "Call",
    "ClientGone",
    "ClientLeft",
    "Reply",
    "Settlement",
    "StreamSource",
    "Trip",
    "WatchDeparture",
]


class ClientGone(Exception):
    """The client disconnected before its request body arrived (nobody to answer)."""


# Returns once the client has gone away (its connection closed).
ClientLeft = Callable[[], Coroutine[Any, Any, None]]
# Calls back once the client has gone away; returns what stops watching. The proxy's own
# HTTP protocol hears it from the connection, with no task per request (direct.py).
WatchDeparture = Callable[[Callable[[], None]], Callable[[], None]]


class StreamSource(Protocol):
    """A streamed answer: iterate for chunks; ``aclose`` always ends and settles it."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: StreamSource | None = None


@dataclass(slots=True)
class Trip:
    """What the dispatcher learns on a request's journey: the pipeline reads it (the reply's
    timing headers, the key's settlement, the log line) and never writes it."""

    deployment: str | None = None  # the last one tried
    retries: int = 0
    queue_wait: float = 0.0  # seconds spent waiting for turns
    upstream_time: float = 0.0  # seconds spent on upstream calls until the answer's headers
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    used: Cost | None = None  # the reported usage per kind, once read
    # A stream that ended without usage: the tokens it is charged instead (never a refund).
    unreported_tokens: int | None = None
    stream_error: str | None = None  # how a stream that broke off ended (its error code)
    usage: TokenUsage | None = None  # what the upstream reported, as its shape read it
    charged: Cost | None = None  # ``charge``'s: what the deployment and the key settle to

    def reported(self, usage: TokenUsage | None) -> None:
        """The usage the upstream reported (None: none it could read)."""
        self.usage = usage
        if usage is None:
            self.prompt_tokens = self.completion_tokens = None
            self.used = None
        else:
            self.prompt_tokens = usage.input_tokens + usage.cache_read
            self.completion_tokens = usage.output_tokens
            self.used = usage_cost(usage)

    def real_tokens(self) -> int | None:
        """Tokens the upstream reported (prompt + completion), if it did."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    def charged_tokens(self) -> int | None:
        """What its budgets are charged: the reported usage, else what a stream without
        usage counts as (``unreported_tokens``); None, unknown: the estimate goes back."""
        real = self.real_tokens()
        return self.unreported_tokens if real is None else real

    def charge(self, estimate: Cost) -> Cost | None:
        """``charged_cost``, kept as ``charged``: once the answer's usage is known, the
        deployment's settlement and the key's read the same cost, computed once."""
        self.charged = self.charged_cost(estimate)
        return self.charged

    def charged_cost(self, estimate: Cost) -> Cost | None:
        """``charged_tokens`` per token kind: the reported usage, else the
        ``unreported_tokens`` (of a stream without usage, of a 200 its shape could not
        read), ``estimate``'s input as input and the rest as output."""
        used = self.used
        if used is not None or self.unreported_tokens is None:
            return used
        total = self.unreported_tokens
        read = min(estimate.get(INPUT_TOKENS, 0.0), total)
        return {TOKENS: float(total), INPUT_TOKENS: read, OUTPUT_TOKENS: total - read}


@dataclass(slots=True)
class Call:
    request_id: str
    shape: Shape  # the API it came through
    started: float
    headers: list[tuple[str, str]] = field(default_factory=list)
    key_name: str | None = None
    # Its key's identity (``ClientKey.identity``): who owns the responses it stores.
    key_identity: str | None = None
    allowed_models: list[str] | None = None  # its key's allow-list (fallbacks too): None, all
    claimant: Claimant = field(default_factory=Claimant)  # fair share: tier and weight
    max_wait: float = 0.0  # the longest this request may wait for a turn, in all
    model: str = "unknown"  # its group's name once known: safe as a metric label
    # The model the client asked for (a group's name, an alias, a name a pattern serves,
    # or one no group has): the log line's (logs.client_text: bounded, printable), never
    # a metric label.
    requested_model: str | None = None
    # The model as the client wrote it (the upstream is sent it when its deployment
    # names none and the model goes in the URL): never a label or a log field.
    asked_model: str | None = None
    # What its URL says beyond its shape (``Shape.model_of``, ``Shape.streamed``).
    target: RequestTarget = AT_PATH
    body: dict[str, Any] = field(default_factory=dict)
    raw: bytes = b""
    stream: bool = False
    estimate: int = 0  # tokens (``cost``'s)
    cost: Cost = NOTHING  # the estimate per limit kind (``Shape.estimate``)
    # Where the upstream's prompt cache may serve it (``Shape.cache_prefixes``): a
    # deployment whose limits do not count cache reads is charged less for what its
    # cache is known to hold (routing/prompt_caches.py).
    prefixes: CachePrefixes | None = None
    trip: Trip = field(default_factory=Trip)  # the dispatcher's: what it learned
    error_code: str | None = None
    shadow_rejection: str | None = None  # the limit a shadow key's request went past
    client_left: ClientLeft | None = None  # watched while the request waits for a turn
    watch_departure: WatchDeparture | None = None  # else client_left, during upstream calls
    key_verdict: KeyVerdict | None = None  # the client key's check, granted or refused
    team: str = ""  # its key's team ("" for none): the spend report's and metric's label
    # A follow-up's earlier conversation, in tokens, which the upstream reads again
    # (follow_ups.py): in its estimate and its budgets' reservation.
    context: int = 0
    # Its budgets' reservation (kind -> amount; empty: no budget applies).
    reserved: dict[str, float] = field(default_factory=dict)
    # The same as a function of its output cap, when a budget of its key may lower it
    # (``budget_edge: clamp``; ``most``: the cap it goes with now), and whether one did.
    clamp: Clamp | None = None
    clamped: bool = False
    # A follow-up of a stored response (proxy/pipeline/affinity.py): the one deployment that holds
    # it (no other, no fallback), and the route below the shape's URL with its method.
    pinned: str | None = None
    upstream_method: str = "POST"
    upstream_path: str = ""
    # The Responses API's: the id of the response a create made (its usage, if not read
    # from the answer, may be read later: spend.Held), and a stored response's usage
    # read from an answer that shows it over (its id and usage: the held one settles).
    created: str | None = None
    retrieved: tuple[str, TokenUsage] | None = None
    # Its trace while traces are on (proxy/observability/tracing.py's ``RequestTrace``, which
    # alone reads and writes it), begun by the first event that needs it; None otherwise.
    trace: object | None = None
    # Its body translated for deployments that do not speak its API (proxy/translate),
    # made on first need; None: none was needed.
    translations: Translations | None = None

    @property
    def input_estimate(self) -> int:
        """Its estimated input tokens."""
        return int(self.cost.get(INPUT_TOKENS, 0))

    @property
    def tier(self) -> str:
        """Its key's priority tier, a metric label (a configured number)."""
        return str(self.claimant.tier)


class Settlement:
    """Gives back what a request took from a budget, exactly once. ``soon``, if given,
    tries to do it at once without a task (True: done or on its way)."""

    def __init__(
        self, run: Callable[[], Awaitable[None]], soon: Callable[[], bool] | None = None
    ) -> None:
        self._run = run
        self._soon = soon
        self._done = False

    async def settle(self) -> None:
        if self._done:
            return
        self._done = True
        await self._run()

    def settle_soon(self) -> bool:
        """Settle now without a task if that can be done; False: await ``settle``."""
        if self._done:
            return True
        if self._soon is not None and self._soon():
            self._done = True
            return True
        return False
