"""Getting one request answered by some deployment of its model: the request's journey.

    order candidates (strategy) -> reserve a turn (limiter: budget + health, one step)
    -> wait for it (bounded) -> forward -> classify the answer -> settle (settlement.py)
    -> on a retryable failure, the next deployment, then the fallback groups

When every deployment is cooling down, the request waits (within ``max_wait``) for the
first to come back; past that it gets 503 with ``retry-after`` for that moment. When they
are merely out of budget, 429 ``model_capacity`` (or ``queue_full``). An upstream 429 is
a turn the limiter paced too fast, not a reason to give up: once its settlement has
taught the limiter (the hold, the learned rate), the request asks again, that deployment
included, and waits for its new turn within what is left of its ``max_wait``. What
happens is reported as events (events.py), one per upstream attempt; metrics and logs
consume them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import httpx

from proxy.catalog.catalog import Catalog, DeploymentRoute, GroupRoute
from proxy.catalog.pacing import NETWORK_MARGIN, RESERVE
from proxy.config.settings import Settings
from proxy.costs import Cost, TokenUsage
from proxy.errors import (
    ClientClosedRequest,
    InvalidRequest,
    ProxyError,
    RateLimited,
    ServiceUnavailable,
    UpstreamError,
)
from proxy.limiter.base import (
    NEUTRAL,
    SUCCESS,
    Activity,
    DeploymentVerdict,
    FastPaths,
    GroupAsk,
    Limiter,
    Outcome,
    Sent,
)
from proxy.money.pricing import COST_HEADER, FREE, format_usd, usd
from proxy.providers.base import Readies
from proxy.request.call import Call, ClientLeft, Reply
from proxy.routing.activity import Tally
from proxy.routing.events import Attempt, Events, WaitCause
from proxy.routing.lines import Line, Lines, Ticket, turn_spacing
from proxy.routing.prompt_caches import PromptCaches
from proxy.routing.settlement import Settler, Turn
from proxy.routing.strategies import RoutingState, first_asked, order_candidates
from proxy.routing.turn_clock import TurnClock
from proxy.upstream.exchange import Answer, Exchange, StreamEnd, Untranslated

__all__ = ["Dispatcher", "Served", "StreamDone"]

logger = logging.getLogger("proxy.routing")

LATENCY_SMOOTHING = 0.2  # weight of the newest sample in the moving average
# A turn this close is slept for plainly: watching the client and the deployment's
# learning costs two tasks and a wait_for, more than the wait itself (a leased turn
# waits at most about a span, 5 ms, behind another replica's lease: limiter/core/
# turns.py); the staleness is checked after it all the same, and a client gone meanwhile
# is noticed by the call's own race (docs/performance.md).
SHORT_WAIT = 0.006
# A turn's sleep that ended early is slept again for at least this: uvloop's timers tick
# in whole milliseconds (a shorter rest would end at once, again and again).
TICK = 0.001
# Turns one request may take again after upstream 429s (beyond ``routing.retries``): each
# is paced by what the 429 taught, so a second 429 means the upstream's hint was wrong.
ASKS_AFTER_429 = 3
INTERRUPTED = Outcome(kind="failure", reason="protocol")

# A stream ended with this status (499: its client left); its usage is reported in the
# call before (``Dispatcher._stream_ended``), so the key settles from it.
StreamDone = Callable[[int], Awaitable[None]]
# Takes what the fallback group named costs the client key before it is tried; raises
# the key's refusal (key_charges.FallbackCharge.admit).
Admit = Callable[[str], Awaitable[None]]


@dataclass(slots=True)
class Served:
    """The answer for the client, and the bookkeeping its attempt still owes once the
    answer is on its way (a buffered one's usage, event and settlement): the pipeline
    runs ``after`` first, then settles the key from what it read (``Call``)."""

    reply: Reply
    after: Callable[[], None] | None = None


class Retryable(Exception):
    """This deployment failed; another may not. ``learning``: it was an upstream 429,
    whose settlement (the hold and what it taught) is that task."""

    def __init__(self, error: UpstreamError, learning: asyncio.Task[None] | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.learning = learning


class GateClosed(Exception):
    """The client key's check refused the request: its error is the answer as it is."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _Trying:
    """One call's tries across its group and fallbacks (``Dispatcher.run``): the attempts
    left, the asks again after upstream 429s, the key's gate still to pass, and the
    answer should no attempt succeed (the last upstream failure, else the first
    refusal)."""

    attempts_left: int
    gate: Awaitable[object] | None
    asks_after_429: int = ASKS_AFTER_429
    after_429: bool = False  # asking again after an upstream 429
    last_error: UpstreamError | None = None
    refusal: ProxyError | None = None


@dataclass(slots=True)
class _Reserving:
    """One call's reservation as ``Dispatcher._reserve`` asks again and again: its place in
    its key's line (lines.py) once in it, the gate still to pass, and what the last ask
    found of the queue and of the call's wait."""

    call: Call
    group: GroupRoute
    gate: Awaitable[object] | None
    line: Line | None = None
    queue_full: bool = False
    budget: float = 0.0  # what is left of the call's max_wait (0 with the queue full)
    margin: float = 0.0  # the pacing margin in force when its last turn was reserved


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        limiter: Limiter,
        transport: httpx.AsyncBaseTransport,
        settler: Settler,
        events: Events,
        rng: random.Random | None = None,
    ) -> None:
        self.routing = settings.routing
        self.catalog = catalog
        self.limiter = limiter
        self.fast: FastPaths | None = limiter if isinstance(limiter, FastPaths) else None
        # The upstream calls (build, send, classify, read budget and usage, redact).
        self.exchange = Exchange(
            transport,
            settings.server.max_upstream_body_size,
            settler.rule.max_hold,
            settler.rule.time,
            settings.server.default_max_tokens,
        )
        self.settler = settler
        self.events = events
        self.rng = rng or random.Random()
        self.waiting = 0  # requests of this replica sleeping for a turn
        self.tally = Tally()  # the same by model, deployment and key (the admin state)
        self.lines = Lines()  # deferred requests, one line per (group, key): lines.py
        # What each deployment's prompt cache is known to hold: prompt_caches.py
        self.prompt_caches = PromptCaches()
        # When granted turns fall on this clock, whatever the replies' delays: turn_clock.py
        self.turn_clock = TurnClock(max_correction=catalog.pacing.margin())
        # What the strategies order by: requests in flight and a latency average.
        self.in_flight: dict[str, int] = {}
        self.latency: dict[str, float] = {}
        self.state = RoutingState(self.in_flight, self.latency)

    def activity(self) -> Activity:
        """What this replica is doing now (published with the limiter's heartbeat)."""
        return self.tally.report(self.in_flight)

    def carry_over(self, previous: Dispatcher) -> None:
        """After a reload: share the routing counts and averages with the dispatcher
        replaced, whose requests still running count in them."""
        self.in_flight = previous.in_flight
        self.latency = previous.latency
        self.state = previous.state
        self.tally = previous.tally  # its waiting and in-flight requests still count
        self.lines = previous.lines  # one line per key, whichever config it came under
        self.prompt_caches = previous.prompt_caches  # the upstreams' caches did not change

    # --- the attempts ---------------------------------------------------------------

    async def run(
        self,
        call: Call,
        group: GroupRoute,
        stream_done: StreamDone,
        gate: Awaitable[object] | None = None,
        admit: Admit | None = None,
    ) -> Served:
        """The first good answer from ``group`` or its fallbacks; else the right error.

        ``gate`` (the client key's check) runs alongside the first reservation and must
        pass before anything is forwarded; if it fails, the reserved turn is given back
        and its error is the answer. ``admit`` takes what a fallback group costs the key
        beyond ``group``'s before it is tried: refused, that fallback is not (the answer
        is the first failure, as when a fallback has no turn within max_wait)."""
        t = _Trying(self.routing.retries + 1, gate)
        # A stored response's follow-up has one deployment: its own (no retry elsewhere).
        pinned = call.pin.deployment is not None
        groups = (group,) if pinned else self._groups(group, call.caller.allowed_models)
        for current in groups:
            served = await self._try_group(call, group, current, stream_done, admit, t)
            if served is not None:
                return served
        call.trip.retries = max(call.trip.retries - 1, 0)
        raise _unanswered(call, t.last_error or t.refusal)

    async def _try_group(
        self,
        call: Call,
        asked: GroupRoute,
        current: GroupRoute,
        stream_done: StreamDone,
        admit: Admit | None,
        t: _Trying,
    ) -> Served | None:
        """The first good answer of ``current``'s deployments (None: none gave one, or
        none had a turn: on to the next group)."""
        tried: set[str] = set()
        while t.attempts_left > 0:
            candidates = self._candidates(call, current, tried)
            if not candidates:
                return None
            await _credentials_ready(candidates)
            turn = await self._turn_in(call, asked, current, candidates, admit, t)
            if turn is None:
                return None
            t.after_429 = False
            t.attempts_left -= 1
            try:
                return await self._attempt(call, turn, stream_done)
            except Untranslated:  # its translation refused: not a candidate, no attempt
                t.attempts_left += 1
                tried.add(turn.deployment.id)
            except Retryable as failure:
                if not await self._asks_again(call, failure, t):
                    tried.add(turn.deployment.id)
        return None

    def _candidates(self, call: Call, group: GroupRoute, tried: set[str]) -> list[DeploymentRoute]:
        """The deployments of ``group`` not tried yet that can serve ``call``: its own
        (a stored response's follow-up), those speaking its API or translating to one."""
        pinned = call.pin.deployment
        candidates = [
            d for d in group.deployments if d.id not in tried and (pinned is None or d.id == pinned)
        ]
        if call.arrival.shape.name not in group.common:  # some need it translated
            candidates = self.exchange.reachable(call, candidates)
        return candidates

    async def _turn_in(
        self,
        call: Call,
        asked: GroupRoute,
        current: GroupRoute,
        candidates: list[DeploymentRoute],
        admit: Admit | None,
        t: _Trying,
    ) -> Turn | None:
        """A turn on one of ``candidates`` (a fallback's charge to the key taken first);
        None: refused (kept as the answer should nothing else answer)."""
        try:
            if admit is not None and current is not asked:
                await admit(current.name)
            turn = await self._reserve(call, current, candidates, t.gate)
        except (RateLimited, ServiceUnavailable) as refused:
            t.last_error = _refused(refused, t.last_error) if t.after_429 else t.last_error
            t.refusal = t.refusal or refused
            return None
        t.gate = None
        return turn

    async def _asks_again(self, call: Call, failure: Retryable, t: _Trying) -> bool:
        """A failed attempt counted; True: it was an upstream 429, whose hold the limiter
        is learning: ask again once it knows (a turn within max_wait is waited for, this
        deployment's or another's)."""
        t.last_error = failure.error
        call.trip.retries += 1
        if failure.learning is None or t.asks_after_429 <= 0:
            return False
        t.asks_after_429 -= 1
        t.attempts_left += 1
        t.after_429 = True
        await asyncio.wait((failure.learning,))
        return True

    def _groups(self, group: GroupRoute, allowed: list[str] | None) -> Iterable[GroupRoute]:
        """``group``, then its fallbacks that the key may use (``allowed``: its
        allow-list, None: every group): a fallback is no way around it."""
        yield group
        for name in self.catalog.fallbacks.get(group.name, []):
            fallback = self.catalog.groups.get(name)
            if fallback is not None and (allowed is None or name in allowed):
                yield fallback

    # --- reserving a turn -------------------------------------------------------------

    async def _reserve(
        self,
        call: Call,
        group: GroupRoute,
        candidates: list[DeploymentRoute],
        gate: Awaitable[object] | None = None,
    ) -> Turn:
        """Reserve a turn on a deployment and sleep until it (bounded by max_wait)."""
        r = _Reserving(call, group, gate)
        try:
            while True:
                turn = await self._reserve_once(r, candidates)
                if turn is not None:
                    return turn
        finally:
            if r.line is not None:
                r.line.leave()

    async def _reserve_once(self, r: _Reserving, candidates: list[DeploymentRoute]) -> Turn | None:
        """One ask for a turn: the turn, slept until (None: ask again); raises the
        refusal."""
        call = r.call
        ordered = order_candidates(self.routing.strategy, candidates, self.rng, self.state)
        # A full queue still lets through a request that needs no waiting.
        r.queue_full = self.waiting >= self.routing.max_queue
        caller = call.caller
        r.budget = 0.0 if r.queue_full else max(caller.max_wait - call.trip.queue_wait, 0.0)
        if r.line is None and r.budget > 0.0 and self.lines.busy(r.group.name, caller.claimant.key):
            # Others of this key wait here for their share: join them, do not ask.
            await self._gate_passed(r, None)
            r.line = await self._queue(call, r.group, r.budget, None)
            return None
        return await self._ask_for_turn(r, ordered)

    async def _ask_for_turn(self, r: _Reserving, ordered: list[DeploymentRoute]) -> Turn | None:
        """``_reserve_once``'s ask of the limiter, and what its verdict leads to."""
        call = r.call
        lease = f"{call.arrival.request_id}.{call.trip.retries}"
        cost = self._upstream_cost(call, ordered)
        verdict = await self._ask(call, r.group.name, ordered, r.budget, lease, cost)
        handled = time.monotonic()
        deferred = verdict.deferred and verdict.retry_after <= r.budget
        if r.line is not None and not deferred:
            self._leave_line(r, r.line, verdict, ordered, cost)
        turn, verdict = self._turn_of(r, verdict, ordered, lease, cost, handled)
        queued = turn is not None and verdict.wait > 0
        if queued:
            self.waiting += 1  # counted at once: no await between check and count
        try:
            await self._gate_passed(r, turn)
        except BaseException:
            if queued:
                self.waiting -= 1
            raise
        if turn is not None:
            if queued:
                await self._sleep_until_turn(r, turn)
            return None if self._taken_again(turn, r.margin) else turn
        await self._unserved(r, verdict, ordered, deferred)
        return None

    def _leave_line(
        self,
        r: _Reserving,
        line: Line,
        verdict: DeploymentVerdict,
        ordered: list[DeploymentRoute],
        cost: Cost,
    ) -> None:
        """The key's line's head asked and was not deferred: it leaves the line, the next
        in line to ask when its turn would fit."""
        if verdict.wait > 0.0:
            spacing = turn_spacing([self.catalog.limits(d) for d in ordered], cost)
            line.not_before = time.monotonic() + max(
                verdict.wait + spacing - self.routing.lookahead, 0.0
            )
        line.leave()
        r.line = None

    def _turn_of(
        self,
        r: _Reserving,
        verdict: DeploymentVerdict,
        ordered: list[DeploymentRoute],
        lease: str,
        cost: Cost,
        handled: float,
    ) -> tuple[Turn | None, DeploymentVerdict]:
        """The turn ``verdict`` reserved (None: none), due on this clock with the pacing
        margin in force (``r.margin``), and the verdict; a turn that would wait while the
        queue filled up meanwhile is given back (refused as a full queue)."""
        deployment = next((d for d in ordered if d.id == verdict.deployment_id), None)
        sent = verdict.sent
        if deployment is None or sent is None:
            return None, verdict
        self.settler.saw(deployment.id, sent.epoch)
        r.margin = self.catalog.pacing.margin()
        due = self._due(r.group.name, sent, verdict.wait, handled, r.margin)
        turn = Turn(deployment, lease, verdict.probe, sent, cost=cost, moment=due)
        self.settler.probe_out(turn)
        if verdict.wait > 0 and self.waiting >= self.routing.max_queue:
            self.settler.give_back(turn, turn.cost)
            r.queue_full = True
            return None, replace(verdict, deployment_id=None, retry_after=verdict.wait)
        return turn, verdict

    async def _gate_passed(self, r: _Reserving, turn: Turn | None) -> None:
        """The call's gate (a fallback's charge), passed once before its first turn."""
        if r.gate is not None:
            gate, r.gate = r.gate, None
            await self._pass_gate(r.call, turn, gate)

    async def _sleep_until_turn(self, r: _Reserving, turn: Turn) -> None:
        """Sleep until the queued ``turn`` is due (it was counted waiting)."""
        assert turn.moment is not None
        left = turn.moment - time.monotonic()
        if left > 0.0:
            await self._wait(r.call, left, turn, "pacing", queued=True)
        else:
            # Its turn came while it was handled (a lease's, read late): it waits for
            # nothing, and is not counted as having waited.
            self.waiting -= 1

    async def _unserved(
        self,
        r: _Reserving,
        verdict: DeploymentVerdict,
        ordered: list[DeploymentRoute],
        deferred: bool,
    ) -> None:
        """No turn: wait to ask again (fair share, a cooldown, a probe's answer), or raise
        the refusal."""
        call, group = r.call, r.group
        if verdict.code == "request_too_large":
            raise InvalidRequest(
                f"This request needs about {call.ask.estimate} tokens, more than any"
                f" deployment of '{group.name}' accepts per minute.",
                code="request_too_large",
            )
        if deferred:
            # Fair share: others are owed the next turns; ask again when told, as the
            # head of this key's line (the others of the key wait behind).
            if r.line is None:
                r.line = await self._queue(call, group, r.budget, verdict.retry_after)
            else:
                r.line.defer(time.monotonic() + verdict.retry_after)
                wait = verdict.retry_after
                await self._wait(call, wait, None, "fair_share", group=group.name)
            return
        if verdict.cooling and 0.0 < verdict.retry_after <= r.budget:
            # Every usable deployment is cooling down: wait for the first to return.
            await self._wait(call, verdict.retry_after, None, "cooldown", group=group.name)
            return
        answered = self._probe_answered(ordered) if verdict.cooling else None
        if answered is not None and r.budget > 0.0:
            # A probe sent from here is out: its answer may come within max_wait (its
            # deadline is only the latest it can come). Wait for it, ask again.
            await self._wait(call, r.budget, None, "cooldown", group=group.name, until=answered)
            return
        raise self._refusal(call, group, verdict.cooling, r.queue_full, verdict.retry_after)

    async def _ask(
        self,
        call: Call,
        group: str,
        ordered: list[DeploymentRoute],
        budget: float,
        lease: str,
        cost: Cost,
    ) -> DeploymentVerdict:
        """The limiter's verdict on a turn for ``call`` (costing ``cost`` upstream): among
        the strategy's first candidates, else among all (``strategies.first_asked``)."""
        first = first_asked(self.routing.strategy, ordered)
        if first is not None:
            verdict = await self._ask_about(call, group, first, budget, lease, cost)
            if verdict.sent is not None or verdict.deferred:
                return verdict
        return await self._ask_about(call, group, ordered, budget, lease, cost)

    async def _ask_about(
        self,
        call: Call,
        group: str,
        candidates: Sequence[DeploymentRoute],
        budget: float,
        lease: str,
        cost: Cost,
    ) -> DeploymentVerdict:
        ask = GroupAsk(
            group,
            [self.catalog.limits(d) for d in candidates],
            cost,
            budget,
            lease,
            self.settler.least_busy,
            call.caller.claimant,
            self.routing.lookahead,
        )
        # An open lease (or the memory limiter) answers without an await.
        if self.fast is not None:
            verdict = self.fast.reserve_now(ask)
            if verdict is None:  # its lease being renewed: the turn it brings
                renewal = self.fast.reserve_on_renewal(ask)
                verdict = None if renewal is None else await renewal
            if verdict is not None:
                return verdict
        return await self.limiter.reserve(ask)

    def _due(self, group: str, sent: Sent, wait: float, handled: float, margin: float) -> float:
        """When a turn ``wait`` ahead, whose reply was ``handled``, is due on this clock:
        one that can go now, at once; a reserved one at its moment on this clock
        (turn_clock.py), but no sooner than ``margin`` before ``wait`` after the reply (a
        limiter clock stepping back), nor before the reply was handled."""
        if wait <= 0.0:
            return handled
        self.turn_clock.max_correction = margin
        moment = self.turn_clock.moment((group, *sent.clock), sent.at, wait, handled)
        return max(moment, handled + wait - margin, handled)

    def _taken_again(self, turn: Turn, margin: float) -> bool:
        """Whether ``turn`` is dropped for a new one: its deployment learned since it was
        reserved (stale: taken again at the new pace), or it is too late to be sent."""
        return self.settler.stale(turn) or self._too_late(turn, margin)

    def _too_late(self, turn: Turn, margin: float) -> bool:
        """Whether ``turn`` (reserved with the pacing ``margin`` in force) is now later
        than the pacing covers (the margin every replica paces with: the least in force
        here over the last seconds, ``Pacing.agreed``, and never less than the 1% kept for
        the network, ``pacing.NETWORK_MARGIN``; less the ``RESERVE`` for what follows the
        check: the write, the network): sent, it could make an upstream window
        of a second see one turn too many, so it is not sent (its request asks for a new
        one, within its max_wait) and its lateness widens the margin at once. A probe
        always goes."""
        if turn.moment is None or turn.probe:
            return False
        pacing = self.catalog.pacing
        late = time.monotonic() - turn.moment
        if late <= max(min(margin, pacing.agreed()), NETWORK_MARGIN) - RESERVE:
            return False
        pacing.dropped(late)
        self.settler.spent(turn)
        return True

    def _probe_answered(self, deployments: list[DeploymentRoute]) -> asyncio.Event | None:
        """The answer of a probe out from here on one of ``deployments`` (None: none)."""
        for d in deployments:
            answered = self.settler.probe_answered(d.id)
            if answered is not None:
                return answered
        return None

    async def _queue(
        self, call: Call, group: GroupRoute, budget: float, retry_after: float | None
    ) -> Line:
        """Take a place in the key's line and wait to head it, then until the moment its
        head is to ask the limiter (``retry_after``: this request was just deferred for
        that long). Ends the request if its client leaves or its ``budget`` (what is left
        of its max_wait) cannot cover the wait."""
        line = self.lines.line(group.name, call.caller.claimant.key)
        now = time.monotonic()
        if retry_after is not None and not line.busy:
            line.not_before = now + retry_after
        ticket = line.join(now + budget, now)
        try:
            refused_until = await self._wait_in_line(call, ticket, budget, group.name)
        except BaseException:
            line.abandon(ticket)
            raise
        if refused_until is not None:
            line.abandon(ticket)
            retry = max(refused_until - time.monotonic(), 0.0)
            raise self._refusal(call, group, False, False, retry)
        try:
            delay = line.not_before - time.monotonic()
            if delay > 0.0:
                await self._wait(call, delay, None, "fair_share", group=group.name)
        except BaseException:
            line.leave()
            raise
        return line

    async def _pass_gate(self, call: Call, reserved: Turn | None, gate: Awaitable[object]) -> None:
        try:
            await gate
        except BaseException as exc:
            if reserved is not None:
                self.settler.give_back(reserved, reserved.cost)
            if isinstance(exc, Exception):
                raise GateClosed(exc) from exc
            raise

    def _refusal(
        self, call: Call, group: GroupRoute, cooling: bool, queue_full: bool, retry_after: float
    ) -> ProxyError:
        # A stored response's follow-up waits for its own deployment only: named.
        held = f"The deployment '{call.pin.deployment}' that holds this response"
        if cooling:
            self.events.refused("model_unavailable", call.ask.model)
            return ServiceUnavailable(
                f"{held} is cooling down after failures; retry after the indicated time."
                if call.pin.deployment is not None
                else f"Every deployment of '{group.name}' is cooling down after failures;"
                " retry after the indicated time.",
                code="model_unavailable",
                retry_after=retry_after,
            )
        scope = "queue_full" if queue_full and call.caller.max_wait > 0 else "model_capacity"
        self.events.refused(scope, call.ask.model)
        message = (
            (
                f"{held} is at capacity; retry after the indicated time."
                if call.pin.deployment is not None
                else f"The model '{group.name}' is at capacity; retry after the indicated time."
            )
            if scope == "model_capacity"
            else "Too many requests are waiting in this proxy; retry shortly."
        )
        return RateLimited(message, code=scope, retry_after=retry_after)

    async def _wait(
        self,
        call: Call,
        seconds: float,
        give_back: Turn | None,
        cause: WaitCause,
        queued: bool = False,
        group: str = "",
        until: asyncio.Event | None = None,
    ) -> None:
        """Sleep ``seconds`` as one of the waiting requests (``queued``: already counted),
        for the turn ``give_back`` or for a model ``group`` with no turn yet; ``cause``:
        why, for its event. A client that leaves meanwhile is noticed at once: its turn
        goes back and ``ClientClosedRequest`` ends the request (nothing goes upstream). A
        turn whose deployment learns meanwhile is stale: the sleep ends then (take a new
        one); so does one ``until`` that event is set. A wait of at most ``SHORT_WAIT`` is slept
        plainly, watching neither: a client gone during it is noticed as the upstream
        call starts (its own race with the departure), staleness by the caller after it."""
        if not queued:
            self.waiting += 1
        on = give_back.deployment if give_back is not None else None
        model, deployment = (on.group, on.id) if on is not None else (group or call.ask.model, None)
        self.tally.wait_started(model, deployment, call.caller.key_name)
        self.events.queued(call.ask.model, 1, call.caller.tier)
        started = time.perf_counter()
        client_left = call.arrival.client_left
        if seconds <= SHORT_WAIT:
            sleeping: Awaitable[object] = (
                asyncio.sleep(seconds)
                if give_back is None
                else sleep_until(time.monotonic() + seconds)
            )
            client_left = None
        elif give_back is not None:
            sleeping = _until_stale(seconds, give_back, self.settler)
        elif until is not None:
            sleeping = _until_set(seconds, until)
        else:
            sleeping = asyncio.sleep(seconds)
        try:
            if not await _watched(sleeping, client_left):
                raise ClientClosedRequest("The client closed the request while it waited.")
        except BaseException:
            if give_back is not None:
                self.settler.give_back(give_back, give_back.cost)
            raise
        finally:
            self.waiting -= 1
            self.tally.wait_ended(model, deployment, call.caller.key_name)
            self.events.queued(call.ask.model, -1, call.caller.tier)
            call.trip.queue_wait += time.perf_counter() - started
        self.events.waited(call, time.perf_counter() - started, cause)

    async def _wait_in_line(
        self, call: Call, ticket: Ticket, budget: float, group: str
    ) -> float | None:
        """Wait as one of the waiting requests for ``ticket`` (at most ``budget`` seconds):
        None once this request heads its line, else when it could be served at the
        earliest (its budget cannot cover the wait). Raises if the client leaves first."""
        if ticket.done():
            return ticket.result()
        self.waiting += 1
        self.tally.wait_started(group, None, call.caller.key_name)
        self.events.queued(call.ask.model, 1, call.caller.tier)
        started = time.perf_counter()
        try:
            turn = asyncio.wait((ticket,), timeout=budget)
            if not await _watched(turn, call.arrival.client_left):
                raise ClientClosedRequest("The client closed the request while it waited.")
        finally:
            self.waiting -= 1
            self.tally.wait_ended(group, None, call.caller.key_name)
            self.events.queued(call.ask.model, -1, call.caller.tier)
            call.trip.queue_wait += time.perf_counter() - started
        self.events.waited(call, time.perf_counter() - started, "fair_share")
        if not ticket.done():  # its max_wait ran out in line
            return time.monotonic() + max(budget - (time.perf_counter() - started), 0.0)
        return ticket.result()

    # --- one upstream call ------------------------------------------------------------

    async def _attempt(self, call: Call, turn: Turn, stream_done: StreamDone) -> Served:
        """One upstream call, raced against the client's departure (as the wait is): a
        client that leaves before the answer ends the call (its connection closed): the
        in-flight count and the key's slot come back at once (``ClientClosedRequest``)."""
        deployment = turn.deployment
        call.trip.deployment = deployment.id
        try:  # the request for this deployment (translated, if it speaks another API)
            request, strip_usage, translated = self.exchange.build(call, deployment)
        except (InvalidRequest, Untranslated):  # it cannot go as it is: its turn goes back
            self.settler.give_back(turn, turn.cost)
            raise
        attempt = Attempt(
            call.arrival.request_id,
            deployment.group,
            deployment.id,
            time.perf_counter(),
            call=call,
            headers=request.fields,
        )
        self._started(attempt)
        self.tally.call_started(call.caller.key_name)
        departure = Departure(call)

        def on_first_chunk() -> None:
            self.events.first_token(attempt, time.perf_counter() - attempt.started)

        async def on_stream_end(end: StreamEnd, usage: TokenUsage | None, events: int) -> None:
            self._stream_ended(call, turn, attempt, end, usage, events)
            await stream_done(200 if end != "abandoned" else 499)

        if turn.moment is not None:  # how late it leaves: the pacing margin measures it
            self.catalog.pacing.record(time.monotonic() - turn.moment)
        try:
            answer = await self.exchange.call(
                call.arrival.shape,
                deployment,
                request,
                strip_usage,
                call.ask.stream,
                attempt.started,
                on_first_chunk,
                on_stream_end,
                translated,
            )
            served = self._answered(call, turn, attempt, answer)
        except BaseException as exc:
            if not attempt.label:  # not ended yet: the turn and in-flight count go back
                self._ended(call, turn, attempt, "abandoned", NEUTRAL, used=None)
            if not departure.stop():
                raise
            if not isinstance(exc, asyncio.CancelledError):
                await _absorb_cancellation()  # it left as the call ended: still pending
            raise _client_closed() from None
        if departure.stop():  # it left as the answer came: the writer finds it gone
            await _absorb_cancellation()
        return served

    def _answered(self, call: Call, turn: Turn, attempt: Attempt, answer: Answer) -> Served:
        """What an exchange came to: a failure ends the attempt now (retried elsewhere
        when it may be); a stream's end comes later (``_stream_ended``); a buffered
        answer's bookkeeping waits until it is on its way (``Served.after``)."""
        call.trip.upstream_time += answer.upstream_time
        self._learn(turn.deployment, answer)
        reply = answer.reply
        if reply is None:
            assert answer.error is not None
            settled = self._ended(
                call,
                turn,
                attempt,
                answer.label,
                answer.outcome,
                used=None,
                refund=answer.refund,
            )
            if not answer.retry:
                raise answer.error
            assert isinstance(answer.error, UpstreamError)  # only an upstream's is retried
            learning = settled if answer.outcome.rate_limited else None
            raise Retryable(answer.error, learning)
        self.events.answered(attempt, reply)
        if reply.stream is not None:
            return Served(reply)
        price = turn.deployment.price
        if price is not FREE and answer.usage is not None:  # its cost is known: said on it
            reply.headers[COST_HEADER] = format_usd(usd(price, answer.usage))
        return Served(reply, partial(self._buffered_ended, call, turn, attempt, answer))

    def _buffered_ended(self, call: Call, turn: Turn, attempt: Attempt, answer: Answer) -> None:
        """A buffered answer is on its way: its usage (read by its shape now), events,
        settlement. A 200 whose usage cannot be read is charged its estimate."""
        usage = answer.usage
        call.trip.reported(usage)
        if usage is None and answer.shape is not None:  # a 200 its shape cannot read
            # Never a refund: no way around a budget.
            call.trip.unreported_tokens = call.ask.estimate
            self.events.usage_unreadable(call.arrival.shape.name, attempt)
        self._ended(
            call,
            turn,
            attempt,
            answer.label,
            answer.outcome,
            used=call.trip.charge(call.ask.cost),
            ended=answer.ended,
            refund=answer.refund,
            usage=usage,
        )

    def _stream_ended(
        self,
        call: Call,
        turn: Turn,
        attempt: Attempt,
        end: StreamEnd,
        usage: TokenUsage | None,
        events: int,
    ) -> None:
        """A stream ended: its usage, events, settlement. Without usage (cut, or never
        told) at least its estimate: reading a stream and leaving before the usage event
        is no way around a token budget."""
        call.trip.reported(usage)
        if usage is None:
            call.trip.unreported_tokens = unreported_tokens(call, events)
            if end == "completed":  # whole, and still no usage its shape could read
                self.events.usage_unreadable(call.arrival.shape.name, attempt)
        outcome = {"completed": SUCCESS, "interrupted": INTERRUPTED}.get(end, NEUTRAL)
        label = "200" if end == "completed" else end
        used = call.trip.charge(call.ask.cost)
        self._ended(call, turn, attempt, label, outcome, used=used, usage=usage)
        if end == "interrupted":
            call.trip.stream_error = "stream_interrupted"

    # --- bookkeeping ------------------------------------------------------------------

    def _started(self, attempt: Attempt) -> None:
        self.in_flight[attempt.deployment] = self.in_flight.get(attempt.deployment, 0) + 1
        self.events.attempt_started(attempt)

    def _ended(
        self,
        call: Call,
        turn: Turn,
        attempt: Attempt,
        label: str,
        outcome: Outcome,
        *,
        used: Cost | None,
        ended: float | None = None,
        refund: bool = False,
        usage: TokenUsage | None = None,
    ) -> asyncio.Task[None] | None:
        """An upstream call ended (at ``ended``, default now): one event, the routing
        state, what the deployment's prompt cache holds, and the deployment's settlement
        in the background (its task, None when there is nothing to settle). ``usage``:
        what its answer reported (the settlement follows the provider's count of it);
        else ``used``, what it is charged per kind (None: unknown; beyond the estimate,
        it is charged); ``refund``: the upstream did not admit it
        (``outcomes.admitted``), its token charge is returned."""
        attempt.ended = ended or time.perf_counter()
        attempt.label, attempt.outcome = label, outcome
        attempt.prompt_tokens, attempt.completion_tokens = (
            call.trip.prompt_tokens,
            call.trip.completion_tokens,
        )
        self.in_flight[attempt.deployment] -= 1
        self.tally.call_ended(call.caller.key_name)
        if outcome.kind == "success":
            previous = self.latency.get(attempt.deployment, attempt.duration)
            self.latency[attempt.deployment] = previous + LATENCY_SMOOTHING * (
                attempt.duration - previous
            )
        self.events.attempt_ended(attempt)
        if usage is not None and call.ask.prefixes is not None:
            sent = time.monotonic() - (time.perf_counter() - attempt.started)
            self.prompt_caches.answered(turn.deployment.id, call.ask.prefixes, usage, sent)
        return self.settler.settle(
            turn, outcome, estimate=turn.cost, used=used, refund=refund, usage=usage
        )

    def _upstream_cost(self, call: Call, candidates: list[DeploymentRoute]) -> Cost:
        """The request's estimate as ``candidates`` count it (one cost for all: the
        largest): without the prompt-cache reads expected on each, where its provider's
        limits do not count them (``Counting``); its whole estimate otherwise."""
        prefixes = call.ask.prefixes
        if prefixes is None:
            return call.ask.cost
        read = min(
            0
            if d.provider.counting.cache_reads
            else self.prompt_caches.expected_read(d.id, prefixes)
            for d in candidates
        )
        # (read > 0: none of them counts cache reads, all leave them out alike)
        return (
            call.ask.cost
            if read <= 0
            else candidates[0].provider.counting.admitted(call.ask.cost, read)
        )

    def _learn(self, deployment: DeploymentRoute, answer: Answer) -> None:
        """What the upstream's rate-limit headers said: its announced limits, and, when
        it is getting low, what it has left (our windows come down to it)."""
        budget = answer.budget
        if budget.empty:
            return
        lowered = self.catalog.announced.announce(
            deployment,
            budget.limit_requests,
            budget.limit_tokens,
            budget.limit_input_tokens,
            budget.limit_output_tokens,
        )
        if lowered:
            self.events.limits_announced(deployment.id, lowered)
        self.events.upstream_budget(deployment.group, deployment.id, budget)
        if answer.remaining is not None:
            self.settler.report(deployment, answer.remaining)


def _unanswered(call: Call, error: ProxyError | None) -> ProxyError:
    """Why no deployment answered: ``error``; none reached at all, the refusal of the
    translation to the only API its deployments speak (a 400 naming the field)."""
    if error is None and call.translations is not None:
        error = call.translations.refusal()
    assert error is not None
    return error


def _refused(
    refused: RateLimited | ServiceUnavailable, upstream_429: UpstreamError | None
) -> UpstreamError | None:
    """What answers when a turn asked again after ``upstream_429`` is refused: held beyond
    max_wait, the upstream's 429, with when the earliest turn comes; at capacity, the
    refusal (None)."""
    if not isinstance(refused, ServiceUnavailable):
        return None
    assert upstream_429 is not None
    upstream_429.retry_after = refused.retry_after
    return upstream_429


class Departure:
    """Watches for the client's departure during an upstream call: the request's task is
    cancelled then (its upstream call with it). No task around the call; under the
    proxy's own protocol no watcher task either (``Arrival.watch_departure``)."""

    def __init__(self, call: Call) -> None:
        self.left = False
        self._task = asyncio.current_task()
        self._unwatch: Callable[[], object] | None = None
        if call.arrival.watch_departure is not None:
            self._unwatch = call.arrival.watch_departure(self._on_left)
        elif call.arrival.client_left is not None:
            watcher = asyncio.ensure_future(call.arrival.client_left())
            watcher.add_done_callback(self._on_watcher_done)
            self._unwatch = watcher.cancel

    def _on_watcher_done(self, watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            self._on_left()

    def _on_left(self) -> None:
        if self._unwatch is None:
            return  # stopped meanwhile (a scheduled callback cannot be taken back)
        self.left = True
        assert self._task is not None
        self._task.cancel()

    def stop(self) -> bool:
        """Stop watching; True if the client left (its cancellation is taken back)."""
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
            if self.left:
                assert self._task is not None
                self._task.uncancel()
        return self.left


def unreported_tokens(call: Call, events: int) -> int:
    """What a stream that ended without usage is charged: its estimate, or its prompt's
    plus an event per token passed to the client if that is more. Never less: reading a
    stream and leaving before the usage chunk is no way around a token budget."""
    return max(call.ask.estimate, call.ask.input_estimate + events)


def _client_closed() -> ClientClosedRequest:
    return ClientClosedRequest("The client closed the request before the upstream answered.")


async def _absorb_cancellation() -> None:
    """Take the cancellation a departure requested that the task has not met yet (an
    ``uncancel`` alone leaves it pending before Python 3.13)."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)


async def _until_set(seconds: float, event: asyncio.Event) -> None:
    """Sleep ``seconds``, or less if ``event`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


async def sleep_until(due: float) -> None:
    """Sleep until ``due`` (``time.monotonic()``), never less. uvloop's timers count whole
    milliseconds from its clock as read when the loop's turn began, so a sleep can end
    early: measured, every sleep of 0.3 ms ended at once, of 1.2 ms up to 1.16 ms early. A
    turn's request must not leave before its turn: what is left is slept again, at least
    a ``TICK`` (late by up to that, within the pacing margin; docs/limiter.md)."""
    left = due - time.monotonic()
    while left > 0.0:
        await asyncio.sleep(left)
        left = due - time.monotonic()
        if left > 0.0:
            left = max(left, TICK)


async def _until_stale(seconds: float, turn: Turn, settler: Settler) -> None:
    """Sleep ``seconds`` until ``turn``, never less (as ``sleep_until``: each wake-up is
    checked on ``time.monotonic()``), or less if it goes stale meanwhile (its deployment
    learned: settlement.Settler.stale)."""
    deadline = time.monotonic() + seconds
    while not settler.stale(turn):
        left = deadline - time.monotonic()
        if left <= 0.0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settler.learning(turn.deployment.id).wait(), max(left, TICK))


async def _watched(waited: Awaitable[object], client_left: ClientLeft | None) -> bool:
    """Await ``waited``; False if the client left first."""
    if client_left is None:
        await waited
        return True
    waiting = asyncio.ensure_future(waited)
    watching = asyncio.ensure_future(client_left())
    try:
        await asyncio.wait((waiting, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, watching):
            task.cancel()
    return not watching.done() or watching.cancelled()


async def _credentials_ready(candidates: list[DeploymentRoute]) -> None:
    """Until the candidates whose wires fetch credentials have them (``Readies``: a
    replica's first token), so that a turn is never spent waiting for them."""
    for deployment in candidates:
        wire = deployment.wire
        if wire is not None and isinstance(wire, Readies):
            await wire.ready()
