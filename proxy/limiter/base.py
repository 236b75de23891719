"""The limiter's contract: limits as data in, verdicts out, whatever the storage.

A limit is a :class:`Window`: at most ``rate.limit`` units of one kind (requests, tokens,
input or output tokens, or any other name: proxy/costs.py) per ``rate.period`` seconds, at
most ``rate.capacity`` at once. A client key and a deployment each carry any number of
windows (a minute, a day, thirty days...); a new window is data, not code. Every backend
answers these questions, each in one step (one Redis round trip):

* ``acquire_key(KeyAsk)``: may this client key send one more request costing ``cost``?
  Client keys get an answer at once (they never wait): every window and the parallel
  slots pass, the key's and its team's (another owner of windows: ``KeyLimits.team``),
  or nothing is charged and the verdict names the window that refused.
* ``reserve(GroupAsk)``: which deployment of one model group can take the request
  soonest, and when? Its windows are charged for that exact turn; the caller sleeps
  ``wait`` seconds and then forwards (no polling).
* ``settle(KeySettlement | DeploymentSettlement)``: after the fact. A key's parallel slot
  is freed and its estimate corrected; a deployment's estimate is corrected, a turn
  nobody used is given back, its in-flight slot freed, the upstream's answer recorded in
  its health (cooldowns, half-open probes, the rate learned from 429s), and what the
  upstream says it has left lowers its per-minute windows (``Remaining``).
* ``snapshot(group, deployments)``: what is left in each deployment's windows and how
  long until each can take a request, its health and learned rate (dashboards,
  readiness, the admin state); ``key_snapshot(limits)`` the same of a client key.

A managed limiter also carries each replica's ``Activity`` (requests waiting and in
flight, which only the replica knows) with its heartbeat, so ``activity()`` is the view
across replicas without a round trip on any request's path.

The effective limits of a deployment are computed in one place, inside each backend's
step: the windows passed in (configured, already scaled to this process's share when
budgets are not shared), refilled at the rate its health has learned.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import field
from operator import attrgetter
from typing import Literal, Protocol, runtime_checkable

from proxy.costs import NOTHING, Cost
from proxy.values import value

Kind = str  # a limit kind: "requests", "tokens", ... (proxy/costs.py); any name works

MINUTE = 60.0
DAY = 86400.0
DEFAULT_MAX_HOLD = 300.0  # server.max_upstream_hold's default: five minutes

# A budget's calendar period in UTC (core/periods.py: a period's index and bounds).
Period = Literal["day", "week", "month"]


_CLAMPS = attrgetter("clamp")  # a budget's ``Quota.clamp``


@value
class Claimant:
    """The client key a reservation is for ("" for requests without a key)."""

    key: str = ""
    tier: int = 0
    weight: float = 1.0


@value
class Quota:
    """At most ``limit`` ``kind`` per calendar ``period``; ``models`` (empty: every
    model) scopes it to those models' requests (applied by the catalog, which leaves
    it out of other models' asks: ``Catalog.ask_limits``). ``name`` names its storage among its
    owner's; ``scope`` (``key``, ``team``) and ``owner`` (the key's or team's name) say
    whose it is (its 429 code, its gauge)."""

    name: str
    kind: str
    limit: float
    period: Period
    models: tuple[str, ...] = ()
    scope: str = "key"
    owner: str = ""
    # Its owner's ``budget_edge: clamp``: a request it cannot pay whole is charged (and
    # sent) with a lower output cap, what it has left pays (``Clamp``, core/edge.py).
    clamp: bool = False

    @property
    def code(self) -> str:
        """Its 429 code: ``key_budget_usd_month``, ``team_budget_tokens_day``."""
        return f"{self.scope}_budget_{self.kind}_{self.period}"


@value
class QuotaUsage:
    """A budget after a decision: what is left now, seconds until it all returns, and
    when that is (UTC seconds: the period's end)."""

    limit: float
    remaining: float
    reset: float
    resets_at: float = 0.0


@value
class Rate:
    """``limit`` units per ``period`` seconds, at most ``capacity`` units at once.

    ``ceiling`` makes a *paced* bucket: a request costing more than ``capacity`` (but at
    most ``ceiling``) still goes, alone, once the bucket has drained; a paced bucket with
    a tiny capacity spends its units exactly at its rate, one request ahead at most.
    Without a ceiling, a request costing more than ``capacity`` can never go."""

    limit: float
    period: float
    capacity: float
    ceiling: float | None = None
    # Derived once here, not per use: the bucket math reads them several times a request
    # (docs/performance.md, "the limiter's per-request Python").
    interval: float = field(init=False, repr=False, compare=False)
    """Seconds one unit of budget takes to refill."""
    largest: float = field(init=False, repr=False, compare=False)
    """The largest request it can ever take (and what 'full' means for headers)."""

    def __post_init__(self) -> None:
        if not (self.limit > 0 and self.period > 0 and self.capacity > 0):
            raise ValueError(f"a Rate needs positive limit, period and capacity: {self}")
        derived = object.__setattr__
        derived(self, "interval", self.period / self.limit)
        ceiling = self.ceiling
        derived(self, "largest", self.capacity if ceiling is None else max(self.capacity, ceiling))

    def capacity_for(self, cost: float) -> float:
        """The capacity a request of ``cost`` is measured against: a paced bucket lets a
        request up to its ceiling go alone once drained (``debt + cost - cost <= 0``)."""
        if cost <= self.capacity or self.ceiling is None or cost > self.ceiling:
            return self.capacity
        return cost


@value
class Window:
    """One limit: ``kind`` units at ``rate``. ``name`` (see :func:`window_name`) is unique
    among one owner's windows: it names the window's storage, so its state survives a
    change of the rate, and its 429 code (``key_<name>``, ``team_<name>``; without the
    models of a model-scoped window's: ``scoped_name``)."""

    name: str
    kind: Kind
    rate: Rate

    def cost(self, cost: Cost) -> float:
        """What a request (or a correction) of ``cost`` costs here: its amount of this
        window's kind (none: 0)."""
        return cost.get(self.kind, 0.0)


_UNITS = (("d", DAY), ("h", 3600.0), ("m", MINUTE), ("s", 1.0))


def describe(window: Window) -> str:
    """``requests per minute``, ``tokens per day``, ``tokens per 30d``: for messages."""
    per = window.rate.period
    span = {MINUTE: "minute", DAY: "day"}.get(per) or window_name(window.kind, per).rsplit("_")[-1]
    return f"{window.kind.replace('_', ' ')} per {span}"


_SHORT_KINDS = {"requests": "r", "tokens": "t"}


def window_name(kind: Kind, per: float) -> str:
    """``rpm``/``tpm`` for a minute, ``rpd``/``tpd`` for a day, else ``requests_10s``,
    ``tokens_30d``, ``input_tokens_1m``: the largest unit that divides ``per`` exactly
    (only requests and tokens have the short forms). A window counting only some models'
    requests is named apart (``scoped_name``)."""
    short = {MINUTE: "m", DAY: "d"}.get(per)
    if short is not None and kind in _SHORT_KINDS:
        return f"{_SHORT_KINDS[kind]}p{short}"
    for unit, seconds in _UNITS:
        count = per / seconds
        if count >= 1 and count == int(count):
            return f"{kind}_{int(count)}{unit}"
    return f"{kind}_{round(per * 1000)}ms"


KEY = "key"
TEAM = "team"


def scoped_name(name: str, models: Sequence[str]) -> str:
    """The storage name of a window counting only ``models``' requests: ``rpm@gpt-4o``
    (``rpm`` and ``rpm@gpt-4o`` are two windows of one owner). Its 429 code is its
    window's (``base_name``): ``key_rpm``."""
    return f"{name}@{','.join(models)}" if models else name


def base_name(name: str) -> str:
    """``rpm`` of ``rpm@gpt-4o``: the window's name without its models."""
    return name.partition("@")[0]


@value
class KeyLimits:
    """An owner's windows: a client key's own limits (``scope`` ``key``) or a team's
    (``team``); no windows, budgets nor ``max_parallel``: unlimited. A key in a team
    carries its team's limits as ``team``: every window and budget of both, and both
    owners' parallel slots, are checked and charged in one step, all or nothing.
    ``scope`` and ``name`` name an owner's storage and its 429 codes (``key_rpm``,
    ``team_rpm``). ``quotas``: its budgets (quota.py)."""

    name: str
    windows: tuple[Window, ...] = ()
    max_parallel: int | None = None
    team: KeyLimits | None = None
    scope: str = KEY
    quotas: tuple[Quota, ...] = ()
    # Derived once, here: every ask and settlement reads them (attributes, not calls;
    # docs/performance.md, "the limiter's per-request Python").
    # The key's limits, then its team's: the order of their windows in spends and verdicts.
    owners: tuple[KeyLimits, ...] = field(init=False, repr=False, compare=False)
    # Every window an ask of this key touches, and every budget: its own, then its team's.
    all_windows: tuple[Window, ...] = field(init=False, repr=False, compare=False)
    all_quotas: tuple[Quota, ...] = field(init=False, repr=False, compare=False)
    slotted: bool = field(init=False, repr=False, compare=False)  # some max_parallel
    unlimited: bool = field(init=False, repr=False, compare=False)  # nothing to check
    clamps: bool = field(init=False, repr=False, compare=False)  # some budget clamps

    def __post_init__(self) -> None:
        # ``@value`` is frozen to mypy only: set as a frozen dataclass would, once.
        team = self.team
        owners = (self,) if team is None else (self, team)
        derived = object.__setattr__
        derived(self, "owners", owners)
        derived(self, "all_windows", tuple(w for o in owners for w in o.windows))
        derived(self, "all_quotas", tuple(q for o in owners for q in o.quotas))
        derived(self, "slotted", any(o.max_parallel is not None for o in owners))
        derived(self, "clamps", any(map(_CLAMPS, self.all_quotas)))
        derived(
            self, "unlimited", not self.all_windows and not self.all_quotas and not self.slotted
        )


@value
class DeploymentLimits:
    """One upstream deployment's budget; no windows: unlimited.

    ``probe_timeout``: the longest one upstream call may take (the deployment's timeout).
    A half-open probe blocks the deployment at most that long after its turn, and an
    in-flight slot stops counting a little after it."""

    id: str
    windows: tuple[Window, ...] = ()
    probe_timeout: float = 60.0


@value
class CooldownRule:
    """``allowed_fails`` counted failures within ``window`` seconds cool a deployment
    for ``time`` seconds (the config's ``routing.cooldown``); what an upstream says
    (a 429's retry-after or reset, when its next request frees up) holds it at most
    ``max_hold`` seconds (``server.max_upstream_hold``)."""

    allowed_fails: int
    window: float
    time: float
    max_hold: float = DEFAULT_MAX_HOLD


@value
class Outcome:
    """What an upstream answer means for the deployment's health.

    ``kind``: ``"success"`` (a probing deployment is healthy again), ``"failure"``
    (counts toward ``allowed_fails``, or cools at once with ``cool_for``), ``"neutral"``
    (no health change: the client's own error, a cancelled request). ``reason`` labels
    metrics and logs ("timeout", "server_error", "rate_limited", "auth", or what kept the
    connection from being made: "dns", "refused", "tls_certificate"... upstream/errors.py).
    ``cool_for``: cool at once for this long (a 429's retry-after or reset, a bad key).
    ``rate_limited``: an upstream 429, which also lowers the effective rate (AIMD)."""

    kind: Literal["success", "failure", "neutral"]
    reason: str = ""
    cool_for: float | None = None
    rate_limited: bool = False


SUCCESS = Outcome(kind="success")
NEUTRAL = Outcome(kind="neutral")


@value
class HealthChange:
    """What a settlement did to the deployment's health."""

    cooled: bool = False  # a cooldown or a 429's hold started or was extended by this call
    recovered: bool = False  # a probe succeeded: healthy again
    cool_for: float = 0.0  # seconds from now until it may take a request again (0: now)
    epoch: int = 0  # the deployment's learning epoch after this call (see health.py)


NO_CHANGE = HealthChange()


@value
class Usage:
    """What a window looks like after a decision, for x-ratelimit-* headers."""

    limit: float
    remaining: float
    reset: float  # seconds until the window is full again


# -- the questions --------------------------------------------------------------------


@value
class Clamp:
    """A request whose output cap the budgets that clamp (``Quota.clamp``) may lower:
    sent with cap ``c`` (output tokens per choice) it costs at most ``base + per * c``
    of each kind (``base``: its input bound, ``per``: one more token of cap, in each of
    its choices); ``most``: the cap it asks for, ``least``: the lowest it may be sent
    with (core/edge.py)."""

    base: Cost
    per: Cost
    most: int
    least: int = 1


@value
class KeyAsk:
    """May the key send one request of ``cost`` (its estimate, ``requests: 1``
    included)? ``slot`` names the request in the key's parallel slots. ``budget_cost``
    (kind -> amount: an upper bound of the request's cost) is what its budgets charge
    (quota.py; ``limits`` holds only those counting the request's model:
    ``Catalog.ask_limits``). ``clamp``: the same bound as a function of the request's
    output cap, when a budget clamps (then ``budget_cost`` is it at ``clamp.most``):
    the budgets charge it at the cap they can pay (core/edge.py)."""

    limits: KeyLimits
    slot: str
    cost: Cost
    budget_cost: Cost = NOTHING
    clamp: Clamp | None = None


@value
class GroupAsk:
    """Reserve ``cost`` (a request's estimate, ``requests: 1`` included) on the candidate whose
    turn comes soonest (the first in ``candidates`` order among equals; one that can go now
    always beats one that must wait). Nothing is charged when no candidate's turn is within
    ``max_wait``.

    A candidate that is cooling down or has a probe out is not reservable at all; one
    whose cooldown is over takes exactly one request, its probe (``verdict.probe``).
    ``least_busy``: among those that can go now, the one with the fewest requests in
    flight across replicas. ``slot`` counts the request in the chosen deployment's
    in-flight set until settled (or ``probe_timeout`` plus a margin after its turn)."""

    group: str
    candidates: Sequence[DeploymentLimits]
    cost: Cost
    max_wait: float
    slot: str = ""
    least_busy: bool = False
    # With both: fair share between client keys (fairness.py). A turn that must wait is
    # committed only within ``lookahead`` seconds and the claimant's share; otherwise the
    # verdict is ``deferred`` (nothing charged; ask again after ``retry_after``).
    claimant: Claimant | None = None
    lookahead: float = 0.0


@value
class Remaining:
    """What an upstream says it has left of its per-minute limits (None: unknown).
    ``requests_wait``: with no request left, seconds until the next one frees up. Token
    kinds: ``tokens``, and Anthropic's ``input_tokens`` and ``output_tokens`` apart."""

    requests: float | None = None
    requests_wait: float | None = None
    tokens: float | None = None
    input_tokens: float | None = None
    output_tokens: float | None = None

    def of(self, kind: str) -> float | None:
        """What is left of a token kind (None: unknown, or not a token kind)."""
        if kind == "tokens":
            return self.tokens
        if kind == "input_tokens":
            return self.input_tokens
        return self.output_tokens if kind == "output_tokens" else None

    def shared(self, n: int) -> Remaining:
        """One of ``n`` replicas' share of what is left."""

        def part(left: float | None) -> float | None:
            return None if left is None else left / n

        return Remaining(
            part(self.requests),
            self.requests_wait,
            part(self.tokens),
            part(self.input_tokens),
            part(self.output_tokens),
        )


@value
class KeySettlement:
    """Free the key's parallel slot ``slot``; add ``cost`` (real minus estimated, per
    kind; negative refunds) to its windows, and ``budget_cost`` (real minus reserved)
    to its budgets' periods that ``started`` (the verdict's ``at``) falls in."""

    limits: KeyLimits
    slot: str
    cost: Cost = NOTHING
    budget_cost: Cost = NOTHING
    started: float = 0.0


@value
class Private:
    """What a backend or the fallback policy carries through its caller and back: the
    caller passes it on (in ``Sent``, in a settlement), never reads it."""

    # Granted by the local fallback (policy.py): its epoch, sequence and time are the
    # fallback's, so only the fallback may learn from it, and vice versa.
    fallback: bool = False
    # Granted from this replica's lease (leases.py): the lease's serial (0: not leased).
    # Its settlements go back to the lease while it is open (the Settler passes it on).
    lease: int = 0
    # A settlement's: give the windows of a minute or less no turn before ``hold``
    # seconds from now (a share of the budget carried between the shared and the local
    # limiter, policy.py).
    hold: float = 0.0


SHARED = Private()  # a turn the shared storage granted; a settlement with nothing private


@value
class Sent:
    """The turn a request was sent on, as ``reserve`` granted it (``DeploymentVerdict``):
    what a 429 on it teaches (health.py)."""

    epoch: int = 0
    sequence: int = 0
    at: float = 0.0  # the turn, in the limiter's time
    private: Private = SHARED

    @property
    def clock(self) -> tuple[bool, bool]:
        """Which clock ``at`` is on (to compare, not to read): the shared storage's, the
        local fallback's, or this replica's lease's."""
        return self.private.fallback, self.private.lease != 0

    @property
    def settles_back(self) -> bool:
        """Its settlements must carry it (a lease's turn: they go back to the lease)."""
        return self.private.lease != 0


@value
class DeploymentSettlement:
    """After the upstream answered (or the request was abandoned): free ``slot`` from the
    in-flight set; add ``cost`` to the windows (real minus estimated per kind; ``requests:
    -1``: a reserved turn nobody used); record ``outcome`` in the health (a 429 learns from
    ``sent``); lower the per-minute windows to ``remaining`` (never raise them); and what
    ``private`` carries (the policy's hold). One step."""

    group: str
    deployment: DeploymentLimits
    rule: CooldownRule
    outcome: Outcome = NEUTRAL
    slot: str = ""
    cost: Cost = NOTHING
    remaining: Remaining | None = None
    sent: Sent | None = None
    private: Private = SHARED


Settlement = KeySettlement | DeploymentSettlement


# -- the answers ----------------------------------------------------------------------


@value
class KeyVerdict:
    allowed: bool
    # None when allowed; else "key_<window name>" | "key_parallel" | "request_too_large"
    # | "key_budget_<kind>_<period>"
    code: str | None = None
    retry_after: float = 0.0  # seconds; meaningful when not allowed
    usage: tuple[tuple[Window, Usage], ...] = ()  # each window after the decision
    window: Window | None = None  # the window that refused (or is too small)
    budgets: tuple[tuple[Quota, QuotaUsage], ...] = ()  # each budget after the decision
    budget: Quota | None = None  # the budget that refused
    at: float = 0.0  # the limiter's time of the decision (a settlement's ``started``)
    # Allowed with the ask's output cap lowered to this (``KeyAsk.clamp``): what its
    # budgets were charged for and the request must be sent with; 0: not lowered.
    cap: int = 0

    def tightest(self, kind: Kind) -> Usage | None:
        """The window of ``kind`` with the least left (what x-ratelimit-* headers show)."""
        best: Usage | None = None
        for window, usage in self.usage:
            if window.kind == kind and (best is None or usage.remaining < best.remaining):
                best = usage
        return best


@value
class DeploymentVerdict:
    # The deployment reserved, or None when none can take the request within max_wait.
    deployment_id: str | None
    wait: float = 0.0  # seconds to sleep before forwarding (0 = go now)
    # None when reserved; else "model_capacity" | "request_too_large"
    code: str | None = None
    # Refused: seconds until the soonest candidate could take the request (its budget
    # within max_wait, or its cooldown over, or its probe's deadline).
    retry_after: float = 0.0
    # Per candidate, seconds until it could take the request: its turn, or for one held
    # by its health the later of the health and budget waits; inf: too large for it.
    waits: dict[str, float] = field(default_factory=dict)
    probe: bool = False  # the reserved request is a half-open probe of a cooled deployment
    # Refused while some candidate that could take the request is held by its health
    # (cooling down, its probe out, or a 429's hold): unavailable, not out of budget.
    cooling: bool = False
    sent: Sent | None = None  # the reserved turn (None when refused)
    # Refused for fair share (GroupAsk.claimant): not out of budget; ask again after
    # ``retry_after`` (a turn will be committed then, within the request's max_wait).
    deferred: bool = False


@value
class DeploymentState:
    """One deployment as the limiter sees it now (times: seconds from now)."""

    unusable_for: float  # seconds until it may take a request (0: now)
    remaining: dict[str, float]  # per window name: units that could be taken at once
    learned: float = 0.0  # requests a second learned from upstream 429s (0: none)
    # When the smallest request (1 request, 1 token) could go: health, every window and
    # the learned one, as a reservation would compute it.
    next_turn: float = 0.0
    reset: dict[str, float] = field(default_factory=dict)  # per window: until full again
    cooling: bool = False  # cooled after failures, not yet proven healthy by a probe
    cool_for: float = 0.0  # seconds left of the cooldown (0: over or none)
    probe_for: float = 0.0  # a half-open probe is out for at most this long (0: none)
    hold_for: float = 0.0  # seconds left of an upstream 429's hold (0: none)


@value
class KeyState:
    """One client key's windows now: units left, seconds until full again, and the
    parallel slots held (its max_parallel leases)."""

    remaining: dict[str, float] = field(default_factory=dict)
    reset: dict[str, float] = field(default_factory=dict)
    slots_held: int = 0
    budgets: tuple[tuple[Quota, QuotaUsage], ...] = ()  # what is left of each budget


@value
class Activity:
    """What one replica is doing now, which only it knows (published with its
    heartbeat): requests sleeping for a turn, per model group, per deployment their turn
    is on and per client key, and upstream calls under way per deployment and per key.
    Deployment ids are unique across the config; ``""`` is a request without a key."""

    replica: str = ""
    waiting: dict[str, int] = field(default_factory=dict)
    waiting_on: dict[str, int] = field(default_factory=dict)
    waiting_keys: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    in_flight_keys: dict[str, int] = field(default_factory=dict)


class StorageError(Exception):
    """The shared storage could not answer (connection, timeout, script error)."""


# Whether the current task's operation reached the shared storage: set by the storage's
# calls (redis/runner.py), cleared and read by the policy around each shared operation.
# One answered from this replica alone (a lease's turn, verdict or settlement) tells a
# circuit breaker nothing of the storage.
STORAGE_REACHED: ContextVar[bool] = ContextVar("storage_reached", default=False)


class LimiterUnavailable(Exception):
    """No verdict can be given: the shared storage is down and ``on_error`` is ``reject``.
    The HTTP layer answers 503. Deliberately not a StorageError: it is the policy's
    answer, not a storage failure to be handled again."""


class LimiterMode(enum.Enum):
    """Where a limiter's verdicts currently come from."""

    SHARED = "shared"  # the shared storage (Redis): budgets are global
    FALLBACK = "fallback"  # storage down, answering from this process's share
    UNAVAILABLE = "unavailable"  # storage down and on_error=reject: LimiterUnavailable
    MEMORY = "memory"  # no shared storage configured: in-process budgets


class Limiter(Protocol):
    """The calls a request needs: the contract every backend implements."""

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict:
        """All-or-nothing check of every window of the key (each charged its kind's
        amount of ``ask.cost``) and of its parallel slots. Never waits."""
        ...

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        """A turn on one deployment of ``ask.group`` (see :class:`GroupAsk`)."""
        ...

    async def settle(self, settlement: Settlement) -> HealthChange:
        """Everything known after the fact (see the two settlement classes); a key's
        settlement changes no health (``NO_CHANGE``)."""
        ...


@runtime_checkable
class FastPaths(Protocol):
    """An optional capability: answers without an await when the backend can give them
    at once. A caller checks for it once (``isinstance``), not per request."""

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict | None:
        """``acquire_key``'s verdict when it can be given at once, without the storage
        (in memory, or from a lease of the key's windows); None: await ``acquire_key``."""
        ...

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict | None:
        """``reserve``'s verdict when it can be given at once, without the storage (in
        memory, or the next request or turn of an open lease); None: await ``reserve``."""
        ...

    def reserve_on_renewal(self, ask: GroupAsk) -> Awaitable[DeploymentVerdict | None] | None:
        """When ``reserve_now`` had no turn because the lease that would give it is being
        renewed: its turn from the renewal, once that is read, with no call of its own
        (None: no renewal on its way, await ``reserve``). The awaited None: the renewal
        brought no turn for it; await ``reserve``."""
        ...

    def settle_soon(self, settlement: KeySettlement) -> bool:
        """A key's settlement nobody awaits, handed over now without a task when that is
        possible (True: done or on its way, its failure handled as ``settle``'s would
        be); False: nothing was done, await ``settle`` instead."""
        ...


class Observable(Protocol):
    """The reads: what the budgets and the replicas look like now (dashboards,
    readiness, the admin state), off any request's path."""

    async def snapshot(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        """Each deployment's windows and health now, by id."""
        ...

    async def key_snapshot(self, limits: KeyLimits) -> KeyState:
        """The key's windows and parallel slots now."""
        ...

    def publish(self, source: Callable[[], Activity]) -> None:
        """Carry ``source()`` (this replica's activity) with every heartbeat."""
        ...

    async def activity(self) -> list[Activity]:
        """Every live replica's activity: their last heartbeat's, and this one's now
        (only this one's when nothing is shared)."""
        ...

    def share_pacing(
        self, own: Callable[[], float | None], heard: Callable[[Mapping[str, float]], None]
    ) -> None:
        """Carry ``own()`` (the pacing margin this replica needs, seconds; None: none)
        with every heartbeat, and hand ``heard`` the live replicas' (by replica id) as
        each heartbeat reads them (catalog/pacing.py). Nothing shared: never called."""
        ...


class Lifecycle(Protocol):
    """Where verdicts come from (mode, readiness, the storage's health), and starting
    and stopping the background work."""

    @property
    def mode(self) -> LimiterMode: ...

    @property
    def fallback_active(self) -> bool:
        """True while verdicts come from the local share because the storage is down."""
        ...

    @property
    def ready(self) -> bool:
        """Verdicts can be given (storage reachable or a fallback in use)."""
        ...

    @property
    def storage_available(self) -> bool:
        """The shared storage answers (always True without one)."""
        ...

    def on_mode_change(self, callback: Callable[[LimiterMode], None]) -> None:
        """Call ``callback(new_mode)`` on every change (for metrics and readiness)."""
        ...

    def on_storage_error(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(operation)`` each time the shared storage fails an operation
        (``"acquire_key"``, ``"reserve"``, ``"settle"``, ``"snapshot"``, ``"key_snapshot"``,
        ``"heartbeat"``, ``"activity"``, ``"config"``; for metrics)."""
        ...

    def on_eviction_policy(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(evicting)`` each time the shared storage's maxmemory-policy has
        been read: at start-up and after each reconnect (eviction.py)."""
        ...

    async def start(self) -> None:
        """Start background work (replica heartbeats). Pair with ``aclose``."""
        ...

    async def aclose(self) -> None: ...


class ManagedLimiter(Limiter, FastPaths, Observable, Lifecycle, Protocol):
    """What ``create_limiter`` returns: the request's calls, the fast paths, the reads
    and the lifecycle, in one object."""
