"""The one place deciding what happens when the shared storage fails: fail open to a
local share of every budget, or fail closed.

``ResilientLimiter`` wraps the Redis limiter with a circuit breaker. After
``failure_threshold`` consecutive storage errors the circuit opens: for ``reset_after``
seconds nothing is sent to Redis. Then one call (a request or a heartbeat) probes it; an
answer closes the circuit and budgets are shared again, a failure reopens it. The calls
of one batch that fails together are one error (one slow reply is noise, not an outage).

While the circuit is open, and for any call that fails (a reservation only once the
circuit is open: until then a failed one is asked again, see ``reserve``):

* ``on_error="local"``: the answer comes from an in-memory limiter holding this
  replica's share of each budget (limit / replicas last seen alive);
* ``on_error="reject"``: ``LimiterUnavailable`` is raised (the HTTP layer answers 503).

Replicas count themselves with heartbeats in Redis (one sorted set, server time): every
``heartbeat_interval`` seconds each writes its id; alive means seen within
``replica_ttl`` seconds. The last count seen sizes the local share. ``replica_id`` must be
unique per process (each uvicorn worker is a replica with its own local share).

Turns cross the switch both ways without being handed out twice. Turns already granted
keep their time whichever side granted them, so each side starts after the other's: the
first local reservation of a deployment holds its local windows (those of a minute or
less, which pace) until the latest shared turn this replica saw, plus ``OUTAGE_MARGIN``
for the turns other replicas took meanwhile; and the call that probes a recovered storage
first carries this replica's latest local turns over as holds on the shared windows (plus
``reset_after``: replicas still in the fallback until their own probe keep handing out
local turns). A restarted, empty Redis then starts after them too. Longer windows (a
day's) start from this replica's share, full: an outage may spend up to one more share
of them.

Deployment health and in-flight counts follow the budgets: shared while Redis answers,
this replica's own in the fallback (a cooldown decided locally is not shared, and is not
carried over when Redis is back).

Settlements and snapshots never raise for storage trouble: with ``on_error="reject"`` they
give up (neutral results: no health change, every deployment usable), since a lease that
cannot be released expires on its own and a lost correction only errs on one request's
estimate. A settlement goes where its request's budget was taken when that was here (a
slot or in-flight slot held locally), otherwise where requests currently go.

Budgets (quotas of a calendar period) lose nothing to an outage: a request's budget
settlement the storage did not get (its circuit was open, or the request was admitted
here) is owed to it and paid once it answers again (after the next good heartbeat):
the correction of a reservation it holds, or the whole cost of a request admitted by
the fallback without its reservation reaching it. A call that was sent and failed is
taken as done, never sent again (a stalled Redis runs what it read once it wakes).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Literal, TypeVar

from proxy.background import stop
from proxy.costs import NOTHING, Cost
from proxy.limiter.base import (
    NO_CHANGE,
    STORAGE_REACHED,
    Activity,
    CooldownRule,
    DeploymentLimits,
    DeploymentSettlement,
    DeploymentState,
    DeploymentVerdict,
    GroupAsk,
    HealthChange,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    KeyState,
    KeyVerdict,
    LimiterMode,
    LimiterUnavailable,
    Private,
    Rate,
    Settlement,
    StorageError,
    Window,
)
from proxy.limiter.core import edge, periods
from proxy.limiter.memory import MemoryLimiter
from proxy.limiter.redis.backend import RedisLimiter
from proxy.limiter.redis.eviction import EvictionWatch

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
OnError = Literal["local", "reject"]
TailKey = tuple[str, str]  # (group, deployment id)
OwedSlot = tuple[KeyLimits, int]  # (a key's limits, the day its settlements started in)

OUTAGE_MARGIN = 0.5
"""Seconds between the last turn one side handed out and the first the other hands out:
other replicas keep reserving turns this one did not see until their calls fail too."""

_CARRY = CooldownRule(allowed_fails=1, window=0.0, time=0.0)  # a neutral settlement's rule
FALLBACK = Private(fallback=True)  # what a turn the local fallback granted carries


class CircuitState(enum.Enum):
    CLOSED = "closed"  # calls go to the storage
    OPEN = "open"  # calls skip the storage until reset_after has passed
    HALF_OPEN = "half_open"  # one probe call is in flight; the others skip


class CircuitBreaker:
    """Consecutive-failure circuit breaker with an injected clock."""

    def __init__(
        self,
        failure_threshold: int = 3,
        reset_after: float = 1.0,
        clock: Clock = time.monotonic,
        on_change: Callable[[CircuitState], None] | None = None,
    ) -> None:
        self._threshold = failure_threshold
        self._reset_after = reset_after
        self._clock = clock
        self._on_change = on_change
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._opened_at = 0.0

    @property
    def state(self) -> CircuitState:
        return self._state

    def try_acquire(self) -> bool:
        """May this call go to the storage? True at most once per opening (the probe)."""
        if self._state is CircuitState.CLOSED:
            return True
        if (
            self._state is CircuitState.OPEN
            and self._clock() - self._opened_at >= self._reset_after
        ):
            self._set(CircuitState.HALF_OPEN)
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self._set(CircuitState.CLOSED)

    def record_failure(self) -> None:
        self._failures += 1
        if self._state is CircuitState.HALF_OPEN or self._failures >= self._threshold:
            self._opened_at = self._clock()
            self._set(CircuitState.OPEN)

    def record_abandoned(self) -> None:
        """The call was cancelled before the storage answered: it proves nothing. A
        probe's slot goes back so the next call probes again."""
        if self._state is CircuitState.HALF_OPEN:
            self._set(CircuitState.OPEN)

    def _set(self, state: CircuitState) -> None:
        if state is not self._state:
            self._state = state
            if self._on_change is not None:
                self._on_change(state)


def share(rate: Rate, replicas: int, cost: float) -> Rate:
    """This replica's part of ``rate`` when ``replicas`` share it.

    The capacity is divided too (a burst from every replica at once would otherwise hit
    the upstream with ``replicas`` times the burst), but never below what one request of
    this ``cost`` needs, if the whole budget could take it: a request the shared budget
    accepts must not become ``request_too_large`` locally.
    """
    if replicas <= 1:
        return rate
    capacity = max(rate.capacity / replicas, min(rate.capacity, cost))
    return replace(rate, limit=rate.limit / replicas, capacity=capacity)


def share_windows(windows: Sequence[Window], replicas: int, cost: Cost) -> tuple[Window, ...]:
    """Every window's share (for a request of ``cost``)."""
    return tuple(replace(w, rate=share(w.rate, replicas, w.cost(cost))) for w in windows)


def share_key(limits: KeyLimits, replicas: int, cost: Cost) -> KeyLimits:
    """The key's share of its windows, slots and budgets, and of its team's: each
    replica may spend its part of what a budget's period allows (its local spend starts
    from nothing: what the shared storage counted is out of reach while it is down)."""
    parallel = limits.max_parallel
    team = limits.team
    return replace(
        limits,
        windows=share_windows(limits.windows, replicas, cost),
        max_parallel=None if parallel is None else max(1, parallel // replicas),
        quotas=tuple(replace(q, limit=q.limit / max(1, replicas)) for q in limits.quotas),
        team=None if team is None else share_key(team, replicas, cost),
    )


def share_deployment(deployment: DeploymentLimits, replicas: int, cost: Cost) -> DeploymentLimits:
    return replace(deployment, windows=share_windows(deployment.windows, replicas, cost))


class _Skipped:
    """The storage was not asked (circuit open) or failed."""


SKIPPED = _Skipped()


class ResilientLimiter:
    """The shared (Redis) limiter behind a circuit breaker, with a local fallback.

    Every operation goes through :meth:`_route`: the shared limiter when the breaker lets
    the call through and it answers, else the local share (``on_error="local"``) or
    ``LimiterUnavailable`` for decisions / a neutral answer for bookkeeping (``reject``).
    """

    def __init__(
        self,
        shared: RedisLimiter,
        *,
        on_error: OnError,
        replica_id: str,
        heartbeat_interval: float = 1.0,
        replica_ttl: float = 3.0,
        initial_replicas: int = 1,
        failure_threshold: int = 3,
        reset_after: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if on_error not in ("local", "reject"):
            raise ValueError(f"on_error must be 'local' or 'reject', not {on_error!r}")
        self._shared = shared
        self._on_error = on_error
        self._replica_id = replica_id
        self._heartbeat_interval = heartbeat_interval
        self._replica_ttl = replica_ttl
        self._replicas = max(1, initial_replicas)
        self._breaker = CircuitBreaker(failure_threshold, reset_after, clock, self._circuit_changed)
        self._clock = clock
        self._reset_after = reset_after
        self._local = MemoryLimiter(clock)
        # The latest turn each side handed out here, per deployment (this clock's time);
        # the local side's with the deployment's limits, to carry them over.
        self._shared_tails: dict[TailKey, float] = {}
        self._local_tails: dict[TailKey, tuple[DeploymentLimits, float]] = {}
        self._seeded: set[TailKey] = set()  # deployments started locally this outage
        self._listeners: list[Callable[[LimiterMode], None]] = []
        self._error_listeners: list[Callable[[str], None]] = []
        self._last_mode = self.mode
        self._heartbeats: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._activity: Callable[[], Activity] | None = None
        # The pacing margin this replica needs, shared with each heartbeat, and where the
        # live replicas' go (catalog/pacing.py); None: not shared.
        self._pacing: (
            tuple[Callable[[], float | None], Callable[[Mapping[str, float]], None]] | None
        ) = None
        # maxmemory-policy is read with the first heartbeat and after every reconnect.
        self._eviction: EvictionWatch | None = None
        self._eviction_check_due = True
        self._failure_threshold = failure_threshold
        # The storage error last counted by the breaker: the calls of one batch fail
        # together with one error, which is one failure, not one per call.
        self._last_failure: BaseException | None = None
        # Budget settlements the storage is owed (sent once it answers again), and the
        # requests admitted here whose reservation it never saw (slot -> reserved).
        self._owed: dict[OwedSlot, KeySettlement] = {}
        self._unshared: dict[str, Cost] = {}

    # -- health ----------------------------------------------------------------------

    @property
    def mode(self) -> LimiterMode:
        if self._breaker.state is CircuitState.CLOSED:
            return LimiterMode.SHARED
        return LimiterMode.FALLBACK if self._on_error == "local" else LimiterMode.UNAVAILABLE

    @property
    def fallback_active(self) -> bool:
        return self.mode is LimiterMode.FALLBACK

    @property
    def ready(self) -> bool:
        return self.mode is not LimiterMode.UNAVAILABLE

    @property
    def storage_available(self) -> bool:
        """The circuit is closed: the last calls to the storage succeeded."""
        return self._breaker.state is CircuitState.CLOSED

    @property
    def owed(self) -> int:
        """Budget settlements the storage is owed (paid once it answers again)."""
        return len(self._owed)

    @property
    def live_replicas(self) -> int:
        """Replicas seen alive at the last successful heartbeat (sizes the local share)."""
        return self._replicas

    @property
    def shared(self) -> RedisLimiter:
        """The Redis limiter behind the policy (its runner also serves the stores kept
        beside the limiter's state: affinity.py, the spend report's ledger.py)."""
        return self._shared

    @property
    def circuit(self) -> CircuitState:
        return self._breaker.state

    @property
    def local(self) -> MemoryLimiter:
        """The in-memory limiter answering while the storage is down (for inspection)."""
        return self._local

    def on_mode_change(self, callback: Callable[[LimiterMode], None]) -> None:
        self._listeners.append(callback)

    def on_storage_error(self, callback: Callable[[str], None]) -> None:
        self._error_listeners.append(callback)

    def on_eviction_policy(self, callback: Callable[[bool], None]) -> None:
        """``callback(evicting)`` whenever the storage's maxmemory-policy has been read
        (eviction.py says what it means, and logs it)."""
        self._eviction = EvictionWatch(callback)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._heartbeats is None:
            self._stopping.clear()
            self._heartbeats = asyncio.create_task(self._heartbeat_loop(), name="limiter-heartbeat")

    async def aclose(self) -> None:
        task, self._heartbeats = self._heartbeats, None
        if task is not None:
            self._stopping.set()
            await stop(task)
            if self._breaker.state is CircuitState.CLOSED:
                await self._pay_owed()  # what the budgets are owed, before leaving
                with contextlib.suppress(StorageError):
                    await self._shared.leave(self._replica_id)
        await self._shared.aclose()
        await self._local.aclose()

    async def heartbeat(self) -> None:
        """One heartbeat now (the background task calls this every interval)."""
        activity = self._own_activity()
        pacing = self._pacing
        if pacing is None:
            count = await self._via_shared(
                "heartbeat",
                lambda: self._shared.heartbeat(self._replica_id, self._replica_ttl, activity),
            )
        else:
            own, heard = pacing
            margin = own()
            beat = await self._via_shared(
                "heartbeat",
                lambda: self._shared.heartbeat_paced(
                    self._replica_id, self._replica_ttl, activity, margin
                ),
            )
            count = beat if isinstance(beat, _Skipped) else beat[0]
            if not isinstance(beat, _Skipped):
                heard(beat[1])
        if not isinstance(count, _Skipped):
            self._replicas = max(1, count)
            await self._pay_owed()
            if self._eviction_check_due:
                await self._check_eviction()

    async def _check_eviction(self) -> None:
        """Read the storage's maxmemory-policy (next heartbeat again if that fails)."""
        read = await self._via_shared("config", self._shared.maxmemory_policy)
        if isinstance(read, _Skipped):
            return
        self._eviction_check_due = False
        if self._eviction is not None:
            self._eviction.observe(*read)

    # -- Limiter ---------------------------------------------------------------------

    async def acquire_key(self, ask: KeyAsk) -> KeyVerdict:
        sent = False

        def shared() -> Awaitable[KeyVerdict]:
            nonlocal sent
            sent = True
            return self._shared.acquire_key(ask)

        def local() -> KeyVerdict:
            self._require_fallback()
            limits = share_key(ask.limits, self._replicas, ask.cost)
            verdict = self._local.acquire_key_now(replace(ask, limits=limits))
            if not sent and verdict.allowed and ask.limits.all_quotas:
                # Its cost is owed whole: what its budgets charged (at a lowered cap too).
                self._unshared[ask.slot] = edge.reserved(ask.budget_cost, ask.clamp, verdict.cap)
            return verdict

        return await self._route("acquire_key", shared, local)

    def _leases_answer(self) -> bool:
        """Whether a lease may answer without the storage: only while the shared side is
        trusted (a lease's answer tells the breaker nothing of the storage) and no
        outage's carry-over is still to land."""
        return self._breaker.state is CircuitState.CLOSED and not self._local_tails

    def acquire_key_now(self, ask: KeyAsk) -> KeyVerdict | None:
        if not self._leases_answer():
            return None
        return self._shared.acquire_key_now(ask)

    def reserve_now(self, ask: GroupAsk) -> DeploymentVerdict | None:
        if not self._leases_answer():
            return None
        verdict = self._shared.reserve_now(ask)
        if verdict is not None:
            self._note_tails(ask.group, verdict)
        return verdict

    def reserve_on_renewal(self, ask: GroupAsk) -> asyncio.Future[DeploymentVerdict | None] | None:
        if not self._leases_answer():
            return None
        served = self._shared.reserve_on_renewal(ask)
        if served is not None:
            served.add_done_callback(partial(self._noted, ask.group))
        return served

    def _noted(self, group: str, served: asyncio.Future[DeploymentVerdict | None]) -> None:
        """A turn from a renewal: its tails noted as ``reserve_now``'s are."""
        if not served.cancelled() and served.exception() is None:
            verdict = served.result()
            if verdict is not None:
                self._note_tails(group, verdict)

    async def reserve(self, ask: GroupAsk) -> DeploymentVerdict:
        async def shared() -> DeploymentVerdict:
            verdict = await self._shared.reserve(ask)
            self._note_tails(ask.group, verdict)
            return verdict

        def local() -> DeploymentVerdict:
            self._require_fallback()
            n = self._replicas
            candidates = [share_deployment(c, n, ask.cost) for c in ask.candidates]
            self._start_locally(ask.group, candidates)
            verdict = self._local.reserve_now(replace(ask, candidates=candidates))
            chosen = next((c for c in ask.candidates if c.id == verdict.deployment_id), None)
            if chosen is None or verdict.sent is None:
                return verdict
            key = (ask.group, chosen.id)
            tail = self._clock() + verdict.wait
            _, latest = self._local_tails.get(key, (chosen, tail))
            self._local_tails[key] = (chosen, max(tail, latest))
            return replace(verdict, sent=replace(verdict.sent, private=FALLBACK))

        verdict = await self._via_shared("reserve", shared)
        # A failed call while the circuit stays closed is no outage (yet): the other
        # replicas keep filling the shared schedule, so a local turn now would be one
        # turn too many beside theirs, and its carry-over would hold the shared schedule
        # back for seconds after. Ask again: if the failed call did run, its turn is
        # only wasted. Once the circuit opens (an outage), the local share answers.
        for _ in range(self._failure_threshold - 1):
            if not isinstance(verdict, _Skipped) or self._breaker.state is not CircuitState.CLOSED:
                break
            verdict = await self._via_shared("reserve", shared)
        return local() if isinstance(verdict, _Skipped) else verdict

    def _note_tails(self, group: str, verdict: DeploymentVerdict) -> None:
        """Every candidate's wait (granted or refused) says how far its turns go (where
        an outage's local turns must start)."""
        now = self._clock()
        for deployment_id, wait in verdict.waits.items():
            if math.isfinite(wait):
                key = (group, deployment_id)
                self._shared_tails[key] = max(now + wait, self._shared_tails.get(key, 0.0))

    async def settle(self, settlement: Settlement) -> HealthChange:
        sent = False

        def local() -> HealthChange:
            if not sent:
                self._owe(settlement)
            return self._settle_locally(settlement)

        def shared() -> Awaitable[HealthChange]:
            nonlocal sent
            sent = True
            return self._shared.settle(_told(settlement, local=False))

        if self._taken_here(settlement):
            return local()  # the request's budget was taken here: give it back here
        return await self._route("settle", shared, local)

    def settle_soon(self, settlement: KeySettlement) -> bool:
        """``settle`` without a task while the storage's calls are batched: the
        settlement rides with the next batch, and its outcome reaches the breaker (and,
        failed, the local fallback) from the batch's callback, as ``_via_shared`` would
        have it. False (nothing done) while an outage's turns must be carried over
        first, or calls are not batched: then await ``settle``."""
        if self._taken_here(settlement):
            self._owe(settlement)
            self._settle_locally(settlement)
            return True
        if self._local_tails or not self._shared.batching:
            return False
        if self._leases_answer():
            # What the lease takes whole tells the breaker nothing. (Past the False
            # above: the lease's part, once taken, is not taken again.)
            left = self._shared.settle_leased(settlement)
            if left is None:
                return True
            settlement = left
        if not self._breaker.try_acquire():
            self._owe(settlement)
            self._settle_locally(settlement)
            return True
        STORAGE_REACHED.set(False)  # a storage call sets it

        def done(error: BaseException | None) -> None:
            # Run at once when nothing was sent, else from the call's future, in the
            # context it was sent from: either way STORAGE_REACHED says which.
            if error is None and not STORAGE_REACHED.get():
                self._breaker.record_abandoned()  # a lease took it whole: no outcome
            elif self._ended("settle", error):
                self._settle_locally(settlement)

        return self._shared.settle_soon(settlement, done)

    async def snapshot(
        self, group: str, deployments: Sequence[DeploymentLimits]
    ) -> dict[str, DeploymentState]:
        def local() -> dict[str, DeploymentState]:
            if self._on_error == "local":
                return self._local.snapshot_now(group, deployments)
            return {d.id: DeploymentState(0.0, {}) for d in deployments}

        return await self._route(
            "snapshot", lambda: self._shared.snapshot(group, deployments), local
        )

    async def key_snapshot(self, limits: KeyLimits) -> KeyState:
        def local() -> KeyState:
            if self._on_error == "local":
                return self._local.key_snapshot_now(share_key(limits, self._replicas, NOTHING))
            return KeyState()

        return await self._route("key_snapshot", lambda: self._shared.key_snapshot(limits), local)

    # -- activity (what each replica is doing, carried by its heartbeat) -------------

    def publish(self, source: Callable[[], Activity]) -> None:
        self._activity = source

    def share_pacing(
        self, own: Callable[[], float | None], heard: Callable[[Mapping[str, float]], None]
    ) -> None:
        self._pacing = (own, heard)

    async def activity(self) -> list[Activity]:
        """The other live replicas' last heartbeat's, and this one's now; only this
        one's while the storage is down."""
        own = self._own_activity()

        async def shared() -> list[Activity]:
            others = await self._shared.activity(self._replica_ttl)
            others.pop(self._replica_id, None)
            return [*others.values(), *([own] if own else [])]

        return await self._route("activity", shared, lambda: [own] if own else [])

    def _own_activity(self) -> Activity | None:
        if self._activity is None:
            return None
        return replace(self._activity(), replica=self._replica_id)

    # -- plumbing --------------------------------------------------------------------

    async def _route(
        self, operation: str, shared: Callable[[], Awaitable[T]], local: Callable[[], T]
    ) -> T:
        """The shared answer when the circuit lets the call through and it succeeds,
        else ``local()``: the one place every operation checks the breaker."""
        result = await self._via_shared(operation, shared)
        return local() if isinstance(result, _Skipped) else result

    async def _via_shared(self, operation: str, call: Callable[[], Awaitable[T]]) -> T | _Skipped:
        """``call()``'s result, or SKIPPED when the circuit is open or the call fails
        (``operation`` names it for the error listeners)."""
        if not self._breaker.try_acquire():
            return SKIPPED
        STORAGE_REACHED.set(False)  # a storage call sets it
        try:
            if self._local_tails:
                await self._carry_over()  # it must land before any shared reservation
            result = await call()
        except StorageError as exc:
            if _being_cancelled():
                # The client library turned our cancellation into an error: honour the
                # cancellation, and do not blame the storage for it.
                self._breaker.record_abandoned()
                raise asyncio.CancelledError from exc
            self._ended(operation, exc)
            return SKIPPED
        except BaseException as exc:
            self._ended(operation, exc)
            raise
        if STORAGE_REACHED.get():
            self._ended(operation, None)
        else:  # answered here alone (a lease's turn or verdict): no outcome of the storage
            self._breaker.record_abandoned()
        return result

    def _ended(self, operation: str, error: BaseException | None) -> bool:
        """A storage call ended (``error`` None: it succeeded): the breaker and, for a
        storage failure, the error listeners are told. True if the storage failed."""
        if error is None:
            self._breaker.record_success()
            return False
        if not isinstance(error, StorageError):
            self._breaker.record_abandoned()  # cancelled, or not the storage's fault
            return False
        log.warning("limiter storage failed: %s", error)
        for listener in self._error_listeners:
            listener(operation)
        if error is not self._last_failure:  # one failed batch is one failure
            self._last_failure = error
            self._breaker.record_failure()
        return True

    def _settle_locally(self, settlement: Settlement) -> HealthChange:
        """A settlement against the local share (held here, or the storage is down)."""
        if self._on_error != "local":
            log.warning("limiter storage unavailable: a settlement was dropped")
            return NO_CHANGE
        return self._local.settle_now(self._local_share(_told(settlement, local=True)))

    def _start_locally(self, group: str, shares: Sequence[DeploymentLimits]) -> None:
        """Hold each deployment's local share, on its first local reservation of this
        outage, until after the latest shared turn seen (plus the margin)."""
        now = self._clock()
        for d in shares:
            key = (group, d.id)
            if key in self._seeded:
                continue
            self._seeded.add(key)
            # Nothing seen of it: light traffic, whose last turns are past (or none).
            hold = self._shared_tails.get(key, -math.inf) + OUTAGE_MARGIN - now
            if hold > 0.0:
                self._local.settle_now(
                    DeploymentSettlement(group, d, _CARRY, private=Private(hold=hold))
                )

    async def _carry_over(self) -> None:
        """Before the first shared call after local turns (the probe, after an outage):
        the shared windows give no turn before this replica's latest local ones (plus the
        margins). Kept for the next call if the storage fails again."""
        tails, self._local_tails = self._local_tails, {}
        self._seeded.clear()
        now = self._clock()
        try:
            for (group, _), (limits, tail) in tails.items():
                hold = tail + self._reset_after + OUTAGE_MARGIN - now
                if hold > 0.0:
                    carry = DeploymentSettlement(group, limits, _CARRY, private=Private(hold=hold))
                    await self._shared.settle(carry)
        except BaseException:
            for key, (limits, tail) in tails.items():
                _, latest = self._local_tails.get(key, (limits, tail))
                self._local_tails[key] = (limits, max(tail, latest))
            raise

    def _owe(self, s: Settlement) -> None:
        """A key settlement's budgets, owed to the storage (it did not get them): the
        correction, or the request's whole cost if its reservation never reached it.
        Summed per key and day (the day says the week and the month too)."""
        if not isinstance(s, KeySettlement) or not s.limits.all_quotas:
            return
        reserved = self._unshared.pop(s.slot, None) or NOTHING
        slot = (s.limits, periods.index("day", s.started))
        before = self._owed.get(slot)
        cost = dict(before.budget_cost) if before is not None else {}
        for part in (s.budget_cost, reserved):
            for kind, amount in part.items():
                cost[kind] = cost.get(kind, 0.0) + amount
        started = s.started if before is None else before.started
        self._owed[slot] = KeySettlement(s.limits, "", budget_cost=cost, started=started)

    async def _pay_owed(self) -> None:
        """The budget settlements owed to the storage, now that it answers, all in one
        go; those the circuit does not let through stay owed. A call sent that fails is
        taken as done (as any settlement's)."""
        owed, self._owed = self._owed, {}
        sent: set[OwedSlot] = set()

        def call(slot: OwedSlot, s: KeySettlement) -> Awaitable[HealthChange]:
            sent.add(slot)
            return self._shared.settle(s)

        try:
            await asyncio.gather(
                *(self._via_shared("settle", partial(call, k, s)) for k, s in owed.items()),
                return_exceptions=True,
            )
        finally:  # (cancelled too: what was not sent stays owed)
            for slot, s in owed.items():
                if slot not in sent:
                    self._owe(s)

    def _require_fallback(self) -> None:
        if self._on_error == "reject":
            raise LimiterUnavailable("rate-limit storage unavailable")

    def _taken_here(self, s: Settlement) -> bool:
        """Whether the settled request was admitted here: a slot held locally, or its
        budgets reserved here alone."""
        return self._held_locally(s) or (isinstance(s, KeySettlement) and s.slot in self._unshared)

    def _held_locally(self, s: Settlement) -> bool:
        """Whether the settled request's slot or in-flight slot was taken here."""
        if isinstance(s, KeySettlement):  # (only max_parallel takes slots)
            return s.limits.slotted and self._local.holds_slot(s.limits, s.slot)
        return self._local.holds_in_flight(s.group, s.deployment.id, s.slot)

    def _local_share(self, s: Settlement) -> Settlement:
        """The settlement against this replica's share of the budgets."""
        n = self._replicas
        if isinstance(s, KeySettlement):
            return replace(s, limits=share_key(s.limits, n, NOTHING))
        remaining = s.remaining
        if remaining is not None and n > 1:  # this replica's share of what is left
            remaining = remaining.shared(n)
        return replace(
            s, deployment=share_deployment(s.deployment, n, NOTHING), remaining=remaining
        )

    def _circuit_changed(self, state: CircuitState) -> None:
        if state is CircuitState.CLOSED:
            self._seeded.clear()  # the next outage starts from the shared turns again
            self._eviction_check_due = True  # reconnected: perhaps to another server
        mode = self.mode
        if mode is self._last_mode:
            return  # e.g. open -> half-open -> open: still the fallback
        self._last_mode = mode
        log.warning("rate limiter mode: %s (circuit %s)", mode.value, state.value)
        for callback in self._listeners:
            try:
                callback(mode)
            except Exception:
                log.exception("limiter mode listener failed")

    async def _heartbeat_loop(self) -> None:
        # Stopped by an event as well as by cancellation, so a cancellation swallowed
        # somewhere below cannot keep it running.
        while not self._stopping.is_set():
            try:
                await self.heartbeat()
            except Exception:  # never let the loop die quietly
                log.exception("limiter heartbeat failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._heartbeat_interval)


def _told(s: Settlement, *, local: bool) -> Settlement:
    """``s`` as one side may hear it: a turn the other side granted teaches it nothing
    (its epoch and sequence count another side's turns); a 429 on it only holds."""
    if (
        isinstance(s, DeploymentSettlement)
        and s.sent is not None
        and s.sent.private.fallback != local
    ):
        return replace(s, sent=None)
    return s


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


__all__ = [
    "OUTAGE_MARGIN",
    "SKIPPED",
    "CircuitBreaker",
    "CircuitState",
    "ResilientLimiter",
    "share",
    "share_deployment",
    "share_key",
    "share_windows",
]
