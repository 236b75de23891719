"""What the proxy knows about one request as it goes, and what it answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
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
from proxy.request.json_splice import set_fields
from proxy.shapes.base import AT_PATH, RequestTarget, Shape
from proxy.values import value

if TYPE_CHECKING:
    from proxy.limiter.base import KeyVerdict
    from proxy.shapes.cache_prefixes import CachePrefixes
    from proxy.translate import Translations

__all__ = [
    "ANONYMOUS",
    "NOT_ADMITTED",
    "NOT_PARSED",
    "NOT_PINNED",
    "Admission",
    "Arrival",
    "Ask",
    "Call",
    "Caller",
    "ClientGone",
    "ClientLeft",
    "Pin",
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


@value
class Arrival:
    """The request as it came in (``Pipeline.handle``'s, built once): the API it came
    through, its headers and what its URL says, and how its client is heard leaving."""

    request_id: str
    shape: Shape  # the API it came through
    started: float
    headers: list[tuple[str, str]] = field(default_factory=list)
    # What its URL says beyond its shape (``Shape.model_of``, ``Shape.streamed``).
    target: RequestTarget = AT_PATH
    client_left: ClientLeft | None = None  # watched while the request waits for a turn
    watch_departure: WatchDeparture | None = None  # else client_left, during upstream calls


@value
class Caller:
    """What its client key says of the request (``Pipeline._identify``'s): who it is,
    what it may ask for, its share of turns and its bound on waiting."""

    key_name: str | None = None
    # Its key's identity (``ClientKey.identity``): who owns the responses it stores.
    key_identity: str | None = None
    allowed_models: list[str] | None = None  # its key's allow-list (fallbacks too): None, all
    claimant: Claimant = field(default_factory=Claimant)  # fair share: tier and weight
    max_wait: float = 0.0  # the longest this request may wait for a turn, in all
    team: str = ""  # its key's team ("" for none): the spend report's and metric's label

    @property
    def tier(self) -> str:
        """Its key's priority tier, a metric label (a configured number)."""
        return str(self.claimant.tier)


@value
class Ask:
    """The request as parsed (``Pipeline._read``'s): its model, body and estimated cost.
    A follow-up's earlier conversation (``FollowUps.prepare``) and a budget's output cap
    (``budgets.py``) make a new one, never change this one (its body included)."""

    model: str = "unknown"  # its group's name once known: safe as a metric label
    # The model the client asked for (a group's name, an alias, a name a pattern serves,
    # or one no group has): the log line's (logs.client_text: bounded, printable), never
    # a metric label.
    requested_model: str | None = None
    # The model as the client wrote it (the upstream is sent it when its deployment
    # names none and the model goes in the URL): never a label or a log field.
    asked_model: str | None = None
    body: dict[str, Any] = field(default_factory=dict)
    raw: bytes = b""
    stream: bool = False
    estimate: int = 0  # tokens (``cost``'s)
    cost: Cost = NOTHING  # the estimate per limit kind (``Shape.estimate``)
    # Where the upstream's prompt cache may serve it (``Shape.cache_prefixes``): a
    # deployment whose limits do not count cache reads is charged less for what its
    # cache is known to hold (routing/prompt_caches.py).
    prefixes: CachePrefixes | None = None
    # A follow-up's earlier conversation, in tokens, which the upstream reads again
    # (follow_ups.py): in its estimate and its budgets' reservation.
    context: int = 0

    @property
    def input_estimate(self) -> int:
        """Its estimated input tokens."""
        return int(self.cost.get(INPUT_TOKENS, 0))

    def sent_with(self, fields: dict[str, Any]) -> Ask:
        """The same ask with ``fields`` set at its body's top level, in its bytes too."""
        return Ask(
            self.model,
            self.requested_model,
            self.asked_model,
            {**self.body, **fields},
            set_fields(self.raw, fields),
            self.stream,
            self.estimate,
            self.cost,
            self.prefixes,
            self.context,
        )


@value
class Admission:
    """What the key's check made of the request (the pipeline's): its verdict, and what
    its budgets reserved. A new one for each step, built by its own methods (cheaper
    than ``dataclasses.replace`` on the request path)."""

    verdict: KeyVerdict | None = None  # the client key's check, granted or refused
    shadow_rejection: str | None = None  # the limit a shadow key's request went past
    # Its budgets' reservation (kind -> amount; empty: no budget applies).
    reserved: Mapping[str, float] = field(default_factory=dict)
    # The same as a function of its output cap, when a budget of its key may lower it
    # (``budget_edge: clamp``; ``most``: the cap it goes with now), and whether one did.
    clamp: Clamp | None = None
    clamped: bool = False

    def judged(self, verdict: KeyVerdict) -> Admission:
        return Admission(verdict, self.shadow_rejection, self.reserved, self.clamp, self.clamped)

    def shadow_refused(self, code: str) -> Admission:
        return Admission(self.verdict, code, self.reserved, self.clamp, self.clamped)

    def reserving(self, reserved: Mapping[str, float], clamp: Clamp | None) -> Admission:
        return Admission(self.verdict, self.shadow_rejection, reserved, clamp, self.clamped)

    def lowered(self, clamp: Clamp) -> Admission:
        """Its budgets' reservation at a cap one of them lowered (``clamp.most``)."""
        return Admission(self.verdict, self.shadow_rejection, self.reserved, clamp, True)


@value
class Pin:
    """A follow-up of a stored response (follow_ups.py's): the one deployment that holds
    it (no other, no fallback), and the route below the shape's URL with its method."""

    deployment: str | None = None
    method: str = "POST"
    path: str = ""


ANONYMOUS = Caller()  # a request refused before its key was read, or under no key
NOT_PARSED = Ask()
NOT_ADMITTED = Admission()
NOT_PINNED = Pin()


@dataclass(slots=True)
class Call:
    """One request on its way: the values its stages made (each attribute assigned by
    its stage's module alone, a new value each time: tests/request/test_call_stages.py),
    and the run-time state of its journey, each with its one writer."""

    arrival: Arrival  # pipeline.py's (``Pipeline.handle``)
    caller: Caller = ANONYMOUS  # pipeline.py's (``Pipeline._identify``)
    ask: Ask = NOT_PARSED  # pipeline.py's (follow_ups.py and budgets.py make new ones)
    admission: Admission = NOT_ADMITTED  # pipeline.py's (the key's check)
    pin: Pin = NOT_PINNED  # follow_ups.py's
    trip: Trip = field(default_factory=Trip)  # the dispatcher's: what it learned
    error_code: str | None = None  # pipeline.py's: the error it was answered
    # follow_ups.py's, once answered (the Responses API's): the id of the response a
    # create made (its usage, if not read from the answer, may be read later:
    # spend.Held), and a stored response's usage read from an answer that shows it over
    # (its id and usage: the held one settles).
    created: str | None = None
    retrieved: tuple[str, TokenUsage] | None = None
    # Its trace while traces are on (proxy/observability/tracing.py's ``RequestTrace``, which
    # alone reads and writes it), begun by the first event that needs it; None otherwise.
    trace: object | None = None
    # Its body translated for deployments that do not speak its API (proxy/translate),
    # made on first need by upstream/exchange.py; None: none was needed.
    translations: Translations | None = None


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
