"""The life of one API request, from client key to answer.

    (the key, authenticated by the endpoint before the body is read) -> parse ->
    model group -> key budget (429 at once) -> dispatcher (deployments, waiting,
    retries, fallbacks) -> reply -> settle the key

Every step that can fail raises a ``ProxyError``; ``handle`` turns it into the contract's
reply, so no path answers without ``x-request-id`` and the key's rate-limit headers. The
key's budget is settled exactly once, when the answer is complete: at once for a buffered
reply, when the stream ends (or its client leaves) for a streamed one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from proxy.background import Background
from proxy.catalog.catalog import Catalog, GroupRoute, TeamLookup
from proxy.config import limit_kinds
from proxy.config.limit_kinds import Priced
from proxy.config.settings import ClientKey, Settings
from proxy.costs import TOKENS, USD, TokenUsage
from proxy.errors import (
    InvalidRequest,
    ModelNotFound,
    ProxyError,
    RateLimited,
)
from proxy.limiter.base import (
    Activity,
    Claimant,
    CooldownRule,
    FastPaths,
    KeyAsk,
    KeyLimits,
    KeySettlement,
    KeyVerdict,
    Limiter,
    describe,
)
from proxy.limiter.core import edge
from proxy.limiter.core.quota import budget_label
from proxy.money.ledger import Ledger, MemoryLedger
from proxy.money.pricing import FREE, Price, usd
from proxy.money.spend import Held, Owner, Spend, correction
from proxy.observability.logs import RequestLog, client_text
from proxy.observability.metrics import Metrics
from proxy.observability.telemetry import telemetry_for
from proxy.pipeline import budgets, key_charges
from proxy.pipeline.affinity import Affinity, affinity_for
from proxy.pipeline.auth import KeyStore, RuntimeLookup, open_when_empty
from proxy.pipeline.error_table import contract_error
from proxy.pipeline.follow_ups import FollowUps, StoredRoute
from proxy.pipeline.key_charges import FallbackCharge
from proxy.request.call import (
    Admission,
    Arrival,
    Ask,
    Call,
    Caller,
    ClientLeft,
    Reply,
    Settlement,
    WatchDeparture,
)
from proxy.request.json_keys import duplicate
from proxy.request.request_ids import new_request_id
from proxy.routing.dispatcher import Dispatcher, Served
from proxy.routing.settlement import Settler
from proxy.shapes import output_caps
from proxy.shapes.base import AT_PATH, RequestTarget, Shape, api_label
from proxy.shapes.ratelimit_headers import format_reset

if TYPE_CHECKING:
    from proxy.observability.tracing import Tracing

__all__ = ["Pipeline"]

logger = logging.getLogger("proxy.pipeline")

_JSON = {"content-type": "application/json"}


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        transport: httpx.AsyncBaseTransport,
        metrics: Metrics,
        share: float = 1.0,
        rng: random.Random | None = None,
        previous: Pipeline | None = None,
        runtime_keys: RuntimeLookup | None = None,
        runtime_teams: TeamLookup | None = None,
        key_store: KeyStore | None = None,
        catalog: Catalog | None = None,
        ledger: Ledger | None = None,
        affinity: Affinity | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``previous``: the pipeline a reload replaces; what this process learned while
        it ran (routing averages, limits its upstreams announced) carries over, and so do
        the keys and teams of the admin API (``runtime_keys``, ``runtime_teams``).
        ``key_store``: the config's keys indexed beforehand, ``catalog`` built beforehand
        (a reload does both in a thread). ``ledger``: where spend is reported (a reload
        keeps the previous pipeline's). ``tracing``: the process's tracer provider when
        traces are on (``telemetry``)."""
        self.settings = settings
        self.ledger: Ledger = ledger or (previous.ledger if previous else MemoryLedger())
        self.catalog = catalog or Catalog(settings, share)
        self.keys: KeyStore = key_store or KeyStore(
            settings.keys, open_when_empty=open_when_empty(settings)
        )
        self._follow_stores(runtime_keys, runtime_teams, previous)
        self.limiter = limiter
        # Where stored responses live: one store per process, kept across reloads.
        if affinity is None:
            affinity = previous.follow_ups.affinity if previous else affinity_for(limiter)
        self.follow_ups: FollowUps = FollowUps(affinity, self.catalog)
        # The fast paths, when the backend has them: looked for once, here.
        self.fast: FastPaths | None = limiter if isinstance(limiter, FastPaths) else None
        self.telemetry = telemetry_for(metrics, tracing, settings, self.catalog)
        self.background = Background()
        routing = settings.routing
        rule = CooldownRule(
            routing.cooldown.allowed_fails,
            routing.cooldown.window,
            routing.cooldown.time,
            settings.server.max_upstream_hold,
        )
        settler = Settler(
            limiter,
            self.catalog,
            rule,
            self.background,
            self.telemetry,
            least_busy=routing.strategy == "least-busy",
        )
        self.dispatcher = Dispatcher(
            settings, self.catalog, limiter, transport, settler, self.telemetry, rng
        )
        if previous is not None:
            self.catalog.carry_over(previous.catalog)
            self.dispatcher.carry_over(previous.dispatcher)
        # Requests being served through this pipeline (ForwardingEndpoint counts them):
        # after a reload, the old pipeline is retired once they are all done.
        self.users = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _follow_stores(
        self,
        runtime_keys: RuntimeLookup | None,
        runtime_teams: TeamLookup | None,
        previous: Pipeline | None,
    ) -> None:
        """The keys and teams of the admin API (``previous``'s when not given), read by
        this pipeline's key store and catalog; what they no longer have, forgotten by
        this catalog."""
        runtime, teams = runtime_keys, runtime_teams
        if runtime is None and previous is not None:  # (an empty store is falsy)
            runtime = previous.keys.runtime
        if teams is None and previous is not None:
            teams = previous.catalog.runtime_teams
        self.keys.runtime = runtime
        if runtime is not None:  # its revoked keys' limits go from this catalog
            runtime.on_gone = self.catalog.forget
        self.catalog.runtime_teams = teams
        if teams is not None:  # and its deleted teams'
            teams.on_gone = self.catalog.forget_team

    def enter(self) -> None:
        self.users += 1
        self._idle.clear()

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0:
            self._idle.set()

    @property
    def waiting(self) -> int:
        """Requests of this replica sleeping for their turn."""
        return self.dispatcher.waiting

    def activity(self) -> Activity:
        """What this replica is doing now: waiting and in flight (the admin state)."""
        return self.dispatcher.activity()

    async def handle(
        self,
        shape: Shape,
        raw: bytes,
        headers: list[tuple[str, str]],
        key: ClientKey | None,
        client_left: ClientLeft | None = None,
        watch_departure: WatchDeparture | None = None,
        route: StoredRoute | None = None,
        target: RequestTarget = AT_PATH,
    ) -> Reply:
        """The answer to one request of ``key`` (``keys.authenticate``: checked from the
        headers before the body was read). ``client_left`` returns once the client has
        gone: a request waiting for its turn or for the upstream stops then. ``target``:
        what its URL says (the model, the stream, for a shape that has them there). ``route``:
        a stored response's route (no body, no model: follow_ups.py)."""
        call = Call(
            Arrival(
                new_request_id(),
                shape,
                time.perf_counter(),
                headers,
                target,
                client_left,
                watch_departure,
            )
        )
        handled = _Handled()
        reply: Reply | None = None
        try:
            reply = await self._serve(call, raw, key, route, handled)
        except Exception as exc:
            reply = self._error_reply(call, contract_error(exc, call.arrival.request_id))
        finally:
            if reply is None or reply.stream is None:
                # A buffered answer (or none: cancelled) is done once on its way: one
                # callback, no task (a stream is done when it ends: ``stream_done``).
                after = handled.served.after if handled.served is not None else None
                status = reply.status if reply is not None else None
                asyncio.get_running_loop().call_soon(
                    self._answered, call, after, handled.settlement, status, time.perf_counter()
                )
        reply.headers["x-request-id"] = call.arrival.request_id
        reply.headers.update(_proxy_headers(call))
        verdict = call.admission.verdict
        if verdict is not None:
            reply.headers.update(shape.key_headers(verdict, time.time()))
        return reply

    async def _serve(
        self,
        call: Call,
        raw: bytes,
        key: ClientKey | None,
        route: StoredRoute | None,
        handled: _Handled,
    ) -> Reply:
        """The request read, its key charged, its answer from the dispatcher (a stored
        response remembered); what it leaves to settle goes in ``handled``, whatever it
        raises."""
        call.caller = self._identify(key)
        group = await self._read(call, call.arrival.shape, raw, key, route)
        key_check, settlement, fallback = self._charge_key(call, key, group)
        handled.settlement = settlement

        async def stream_done(status: int) -> None:
            # Its client may leave meanwhile, cancelling the stream's task: the
            # bookkeeping is a task of its own, done whole whatever becomes of that one.
            await asyncio.shield(
                self.background.run(self._stream_bookkeeping(call, settlement, status))
            )

        gate = key_check
        if key_check is not None and key_check.done():
            # Judged at once (in memory, or a lease's): a refusal answers before any turn
            # is reserved, and a request let through needs no gate.
            key_check.result()
            gate = None
        admit = None if fallback is None else fallback.admit
        served = await self.dispatcher.run(call, group, stream_done, gate=gate, admit=admit)
        handled.served = served
        if not call.arrival.shape.stores_responses:
            return served.reply
        reply = await self.follow_ups.answered(call, route, served.reply)
        self._settle_retrieved(call, key)
        return reply

    async def _stream_bookkeeping(
        self, call: Call, settlement: Settlement | None, status: int
    ) -> None:
        """A stream's end: its key settled, then its metrics, log line and report."""
        try:
            if settlement is not None:
                await settlement.settle()
        finally:
            self._finish(call, status)

    def _answered(
        self,
        call: Call,
        after: Callable[[], None] | None,
        settlement: Settlement | None,
        status: int | None,
        ended: float,
    ) -> None:
        """A buffered answer is on its way, in this order: its attempt's bookkeeping
        (``Served.after``: the usage its shape reads), the key settled from that usage,
        then the request's metrics and log line (``status`` None: it was cancelled,
        nobody hears an answer)."""
        try:
            if after is not None:
                after()
        finally:  # the key is settled whatever became of the attempt's bookkeeping
            if settlement is not None:
                self._settle_soon(settlement)
            if status is not None:
                self._finish(call, status, ended)

    def reject(self, shape: Shape, error: ProxyError, *, close: bool = False) -> Reply:
        """The reply for a request refused before its body was read (key, size, type,
        time); ``close``: the connection closes after it (its body stopped arriving)."""
        call = Call(Arrival(new_request_id(), shape, time.perf_counter()))
        reply = self._error_reply(call, error)
        if close:
            reply.headers["connection"] = "close"
        reply.headers["x-request-id"] = call.arrival.request_id
        reply.headers.update(_proxy_headers(call))
        self._finish(call, reply.status)
        return reply

    async def drain(self) -> None:
        """Wait for pending bookkeeping (at shutdown)."""
        await self.background.drain()

    async def retire(self) -> None:
        """Replaced by a reload: let the requests it is serving (running or waiting for
        their turn) finish under it, then its bookkeeping."""
        await self._idle.wait()
        await self.background.drain()

    # --- steps ------------------------------------------------------------------------

    def _identify(self, key: ClientKey | None) -> Caller:
        """The key's name, team, allow-list, share and bound on waiting."""
        max_wait = self.settings.routing.max_wait
        if key is None:
            return Caller(max_wait=max_wait)
        return Caller(
            key.name,
            key.identity(),
            key.models,
            Claimant(key.name, key.priority, key.weight),
            max_wait if key.max_wait is None else key.max_wait,
            key.team or "",
        )

    async def _read(
        self,
        call: Call,
        shape: Shape,
        raw: bytes,
        key: ClientKey | None,
        route: StoredRoute | None,
    ) -> GroupRoute:
        """The request read and checked, its cost estimated: its model group (the ask,
        on the call as far as it was read when a step refuses it: the log line's)."""
        if route is None:
            group = self._group(call, _parse_body(raw), raw)
        else:
            group = await self.follow_ups.stored(call, route)
            # A stored response's route: its query said (follow_ups).
            call.ask = Ask(group.name, stream=route.stream)
        ask = call.ask
        self.keys.authorize(key, group.name)
        _check_speaks(group, shape)
        body = ask.body
        shape.check(body)
        stream = ask.stream if route is not None else shape.streamed(body, call.arrival.target)
        estimate = shape.estimate(body, self.settings.server.default_max_tokens)
        cost = limit_kinds.price(estimate, Priced(shape.name, body, stream))
        call.ask = Ask(
            ask.model,
            ask.requested_model,
            ask.asked_model,
            body,
            ask.raw,
            stream,
            int(cost[TOKENS]),
            cost,
            shape.cache_prefixes(body, ask.raw),
        )
        if shape.stores_responses:
            call.ask = await self.follow_ups.prepare(call, group)
        return group

    def _group(self, call: Call, body: dict[str, Any], raw: bytes) -> GroupRoute:
        """The model group ``body`` asks for; the ask, as far as it is known, on ``call``."""
        model = call.arrival.shape.model_of(body, call.arrival.target)
        if not isinstance(model, str) or not model:
            call.ask = Ask(body=body, raw=raw)
            raise InvalidRequest(
                "'model' is required and must be a string.", code="missing_model", param="model"
            )
        group = self.catalog.route(model)
        # The log line names it beside its group (an alias, a name a pattern serves; an
        # unknown one: the group to configure); no metric label ever does.
        name = "unknown" if group is None else group.name
        call.ask = Ask(name, client_text(model), model, body, raw)
        if group is None:
            raise ModelNotFound(f"The model '{model[:200]}' does not exist.", param="model")
        return group

    def _charge_key(
        self, call: Call, key: ClientKey | None, group: GroupRoute
    ) -> tuple[asyncio.Future[KeyVerdict] | None, Settlement | None, FallbackCharge | None]:
        """The key's check for the model asked for (None: nothing to check or charge: no
        limiter call at all), its settlement, and what a fallback group costs the key
        beyond it (None: nothing: key_charges.py)."""
        limits = self.keys.limits(key, self.catalog.key_limits)
        if limits is None or key is None:
            return None, None, None
        asked = self.catalog.ask_limits(key, limits, group.name)
        fallback = None
        if self.catalog.fallbacks.get(group.name) and self.catalog.scoped(key):
            fallback = self._fallback_charge(call, key, limits, group)
        if asked.unlimited:
            if fallback is None:
                return None, None, None
            return None, self._key_settlement(call, asked, None, fallback), fallback
        if asked.all_quotas:
            clamp = self._may_clamp(key, limits, asked, fallback is not None)
            self._reserve_budget(call, call.arrival.shape, group, clamp)
        key_check = self._check_key(call, asked, shadow=key.shadow)
        return key_check, self._key_settlement(call, asked, key_check, fallback), fallback

    def _fallback_charge(
        self, call: Call, key: ClientKey, limits: KeyLimits, group: GroupRoute
    ) -> FallbackCharge:
        """What the fallbacks of ``group`` cost ``key`` (its ``limits``) beyond ``group``:
        taken before one is tried, all or nothing, never waiting (a refusal: that fallback
        is not tried)."""

        async def acquire(added: KeyLimits, slot: str) -> KeyVerdict | None:
            # No budget counted the model asked for: this one's reserve now.
            if added.all_quotas and not call.admission.reserved:
                self._reserve_budget(call, call.arrival.shape, group, self._may_clamp(key, limits))
            verdict = await self.limiter.acquire_key(_key_ask(call, added, slot))
            if not self._goes_on(call, added, key.shadow, verdict):
                code, wait = verdict.code or "rate_limited", verdict.retry_after
                raise RateLimited(_refusal_message(verdict), code=code, retry_after=wait)
            if verdict.cap:  # sent with the cap it could pay (its own reservation: moved)
                _lower_cap(call, call.admission, verdict.cap)
            return verdict if verdict.allowed else None

        def limits_for(served: str) -> tuple[KeyLimits, KeyLimits]:
            return self.catalog.fallback_limits(key, limits, group.name, served)

        return FallbackCharge(call, limits_for, acquire, self.limiter.settle, self.catalog.prices)

    def _may_clamp(
        self,
        key: ClientKey,
        limits: KeyLimits,
        asked: KeyLimits | None = None,
        fallbacks: bool = True,
    ) -> bool:
        """Whether a budget that ``key``'s request is charged to may lower its output cap
        (``budget_edge: clamp``): one of ``asked`` (its check's), or with ``fallbacks``
        any of the key's (``limits``) and its team's. Never a shadow key's: its limits are
        counted, not enforced."""
        if key.shadow:
            return False
        if asked is not None and asked.clamps:
            return True
        return fallbacks and self.catalog.with_team(key, limits).clamps

    def _check_key(self, call: Call, limits: KeyLimits, shadow: bool) -> asyncio.Future[KeyVerdict]:
        """The key's verdict to come (the dispatcher's gate): given at once when the
        limiter can (in memory, or a lease's), else asked together with the first
        reservation, one Redis round trip for both."""
        ask = _key_ask(call, limits, call.arrival.request_id)
        verdict = None if self.fast is None else self.fast.acquire_key_now(ask)
        if verdict is None:
            return asyncio.ensure_future(self._acquire_key(call, ask, shadow))
        done: asyncio.Future[KeyVerdict] = asyncio.get_running_loop().create_future()
        try:
            done.set_result(self._judge_key(call, ask, shadow, verdict))
        except ProxyError as refusal:
            done.set_exception(refusal)
        return done

    async def _acquire_key(self, call: Call, ask: KeyAsk, shadow: bool) -> KeyVerdict:
        return self._judge_key(call, ask, shadow, await self.limiter.acquire_key(ask))

    def _judge_key(self, call: Call, ask: KeyAsk, shadow: bool, verdict: KeyVerdict) -> KeyVerdict:
        """The key's verdict; a refusal raises, except in ``shadow`` mode: then it is
        counted and the request goes on, charged nothing (as a refused one would be), so
        the key's windows keep counting exactly what enforcing them would let through."""
        limits = ask.limits
        # Its x-ratelimit-* go on the answer, 429s included.
        call.admission = call.admission.judged(verdict)
        if self._goes_on(call, limits, shadow, verdict):
            if verdict.cap:  # its budgets could pay a lower output cap: reserved, sent
                admission = call.admission
                reserved = dict(edge.reserved(admission.reserved, admission.clamp, verdict.cap))
                _lower_cap(call, admission.reserving(reserved, admission.clamp), verdict.cap)
            return verdict
        code = verdict.code or "rate_limited"
        self.telemetry.refused(code, call.ask.model)
        if code == "request_too_large":
            raise InvalidRequest(
                f"This request needs about {call.ask.estimate} tokens, more than the key"
                f" '{limits.name}' may ever use at once; lower max_tokens or the input.",
                code="request_too_large",
            )
        raise RateLimited(_refusal_message(verdict), code=code, retry_after=verdict.retry_after)

    def _goes_on(self, call: Call, limits: KeyLimits, shadow: bool, verdict: KeyVerdict) -> bool:
        """Whether the request goes on past ``verdict`` of ``limits``: allowed, or a
        shadow key's refusal (counted); its budgets' gauges set either way."""
        for budget, left in verdict.budgets:
            self.telemetry.budget_left(budget.owner, budget_label(budget), left.remaining)
        if verdict.allowed:
            return True
        if not shadow:
            return False
        code = verdict.code or "rate_limited"
        call.admission = call.admission.shadow_refused(code)
        self.telemetry.shadow_refused(limits.name, code)
        return True

    def _key_settlement(
        self,
        call: Call,
        limits: KeyLimits,
        key_check: asyncio.Future[KeyVerdict] | None,
        fallback: FallbackCharge | None,
    ) -> Settlement:
        def settlement() -> KeySettlement | None:
            """What to give back once the key check is over (None: nothing was taken,
            it was refused, never answered, or never asked). Unknown usage (an error, no
            usage in a buffered answer) refunds the whole estimate; a stream without usage
            is charged at least it (Trip.charge)."""
            granted = _granted(key_check)
            if granted is None:
                return None
            prices = self.catalog.prices
            return key_charges.settlement(call, limits, call.arrival.request_id, granted.at, prices)

        async def release() -> None:
            if key_check is not None and not key_check.done():  # it is, once answered
                await asyncio.wait([key_check])
            s = settlement()
            moved = [] if fallback is None else await fallback.settlements(s)
            for each in moved if s is None else [s, *moved]:
                await self.limiter.settle(each)

        def release_soon() -> bool:  # no task: the usual case, after an answer
            if fallback is not None and fallback.moved is not None:
                return False  # settlements in order, with a fallback's: a task
            if key_check is None or not key_check.done():
                return key_check is None
            s = settlement()
            return s is None or (self.fast is not None and self.fast.settle_soon(s))

        return Settlement(release, release_soon)

    def _reserve_budget(self, call: Call, shape: Shape, group: GroupRoute, clamp: bool) -> None:
        """What the key's budgets reserve for this request (an upper bound of its cost;
        ``clamp``: also as a function of its output cap, which a budget may lower); a
        request without an output cap goes with the one it was reserved for."""
        reservation = budgets.reservation(
            call.ask.body,
            call.ask.raw,
            shape,
            self.settings.server.default_max_tokens,
            self.catalog.dearest.get(group.name, FREE),
            call.ask.context,
            clamp=clamp,
        )
        call.admission = call.admission.reserving(dict(reservation.cost), reservation.clamp)
        if reservation.cap_field is not None:  # (at any depth: its top-level field set)
            ask = call.ask
            call.ask = ask.sent_with(
                output_caps.with_cap(ask.body, reservation.cap_field, reservation.cap)
            )

    def _settle_soon(self, settlement: Settlement) -> None:
        if not settlement.settle_soon():
            self.background.run(settlement.settle())

    def _error_reply(self, call: Call, error: ProxyError) -> Reply:
        call.error_code = error.code
        body = call.arrival.shape.error_body(error)
        return Reply(status=error.status, headers={**_JSON, **error.headers()}, body=body)

    def _finish(self, call: Call, status: int, ended: float | None = None) -> None:
        duration = (ended or time.perf_counter()) - call.arrival.started
        cost = self._spent(call)
        self.telemetry.request_finished(
            RequestLog(
                request_id=call.arrival.request_id,
                key_name=call.caller.key_name,
                model=call.ask.model,
                requested_model=call.ask.requested_model,
                deployment=call.trip.deployment,
                status=status,
                latency_ms=round(duration * 1000, 2),
                queue_wait_ms=round(call.trip.queue_wait * 1000, 2),
                prompt_tokens=call.trip.prompt_tokens,
                completion_tokens=call.trip.completion_tokens,
                retries=call.trip.retries,
                error_code=call.error_code or call.trip.stream_error,
                shadow_rejection=call.admission.shadow_rejection,
                cost_usd=cost,
                api=api_label(call.arrival.shape.name),
            ),
            duration,
            call,
        )

    def _spent(self, call: Call) -> float | None:
        """The request's dollars, counted (metric) and reported (ledger) once its usage
        is known: to the period its key's check was in (a stream that ends after
        midnight is the day before's); None when no usage was reported (an estimate
        may be reported instead: ``_estimated``)."""
        if call.trip.deployment is None:
            return None
        price = self.catalog.prices.get(call.trip.deployment, FREE)
        model = self.catalog.group_of.get(call.trip.deployment, call.ask.model)  # a fallback's
        owner = Owner(call.caller.key_name or "", call.caller.team, model)
        verdict = call.admission.verdict
        started = verdict.at if verdict is not None and verdict.at else time.time()
        usage = budgets.usage_of(call)
        if usage is None:
            self._estimated(call, owner, price, started)
            return None
        free = price is FREE  # an unpriced deployment: no dollars to count or price
        cost = 0.0 if free else usd(price, usage)
        if not free:  # (which dollars move the metric is Metrics.spend's rule)
            self.telemetry.spent(owner.key, owner.team, owner.model, cost)
        spend = Spend(cost, usage.input_tokens + usage.cache_read, usage.output_tokens)
        self.ledger.add(owner, spend, started)
        return None if free else cost

    def _estimated(self, call: Call, owner: Owner, price: Price, started: float) -> None:
        """A request charged without its usage: reported as what it was charged, an
        estimate. A response that may tell its usage later (a background one) is held
        until then, and counted in the metric once it does (a counter takes nothing
        back); any other estimate is counted now."""
        spend = budgets.estimated_spend(call, price)
        if spend is None:
            return
        self.ledger.add(owner, spend, started)
        if call.created is None:
            self.telemetry.spent(owner.key, owner.team, owner.model, spend.usd)
            return
        # Its budgets hold the reservation only if its key check took it (not a shadow
        # key's refused request): only then is there a budget to correct later.
        verdict = call.admission.verdict
        reserved = call.admission.reserved if verdict is not None and verdict.allowed else {}
        deployment = call.trip.deployment or ""
        self.ledger.hold(call.created, Held(owner, started, deployment, spend, reserved))

    def _settle_retrieved(self, call: Call, key: ClientKey | None) -> None:
        """A stored response's answer told its usage: its held estimate, if any, is
        settled to it, in the background, against the budgets of ``key`` that count its
        model."""
        if call.retrieved is None:
            return
        response_id, usage = call.retrieved
        limits = self.keys.limits(key, self.catalog.key_limits)
        if limits is not None and key is not None:
            limits = self.catalog.ask_limits(key, limits, call.ask.model)
        self.background.run(self._settle_held(response_id, usage, limits))

    async def _settle_held(
        self, response_id: str, usage: TokenUsage, limits: KeyLimits | None
    ) -> None:
        """A held estimate replaced by the real usage, once (``Ledger.claim``): in the
        report, the metric, and the budgets it was charged to (``limits``: its key's)."""
        held = await self.ledger.claim(response_id)
        if held is None:
            return
        price = self.catalog.prices.get(held.deployment, FREE)
        real = budgets.real_cost(usage, price)
        spent = Spend(real[USD], usage.input_tokens + usage.cache_read, usage.output_tokens)
        self.ledger.add(held.owner, correction(held.spend, spent), held.started)
        self.telemetry.spent(held.owner.key, held.owner.team, held.owner.model, spent.usd)
        if held.reserved and limits is not None and limits.all_quotas:
            budget_cost = budgets.correction(real, held.reserved)
            await self.limiter.settle(
                KeySettlement(limits, "", budget_cost=budget_cost, started=held.started)
            )


@dataclass(slots=True)
class _Handled:
    """What ``Pipeline._serve`` leaves to do once the answer is on its way (or an error
    answered): the key's settlement, and the attempt's bookkeeping (``Served.after``)."""

    settlement: Settlement | None = None
    served: Served | None = None


def _granted(key_check: asyncio.Future[KeyVerdict] | None) -> KeyVerdict | None:
    """The key's verdict if the key check is over and took the request's share (a shadow
    key's request its limits refused went on having taken nothing)."""
    if key_check is None or not key_check.done() or key_check.cancelled():
        return None
    if key_check.exception() is not None:
        return None
    verdict = key_check.result()
    return verdict if verdict.allowed else None


def _key_ask(call: Call, limits: KeyLimits, slot: str) -> KeyAsk:
    """The ask of ``limits`` for ``call``: its estimate, and its budgets' reservation
    (as a function of its output cap when one of ``limits``' budgets clamps)."""
    clamp = call.admission.clamp if limits.clamps else None
    return KeyAsk(limits, slot, call.ask.cost, budgets.bound_now(call), clamp)


def _lower_cap(call: Call, admission: Admission, cap: int) -> None:
    """``call`` to go with at most ``cap`` output tokens (``budgets.lower_cap``), its
    budgets' reservation as ``admission`` has it."""
    call.ask, call.admission = budgets.lower_cap(call.ask, admission, call.arrival.shape, cap)


def _check_speaks(group: GroupRoute, shape: Shape) -> None:
    """A model none of whose deployments serves the request's API: the client's error."""
    if shape.name not in group.shapes:  # the names its deployments speak (``speaks``)
        raise InvalidRequest(
            f"The model '{group.name}' is not served through the {shape.name} API.",
            code="unsupported_api",
            param="model",
        )


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_body")
    twice = duplicate(raw, body)
    if twice is not None:  # the parse keeps the last; the upstream, sent the bytes, may not
        raise InvalidRequest(
            f"The request body has the key '{twice}' more than once in one object;"
            " give each key once.",
            code="duplicate_key",
            param=twice,
        )
    return body


def _proxy_headers(call: Call) -> dict[str, str]:
    """The proxy's own time so far (without the upstream and the wait for a turn), the
    wait when there was one, and whether a budget lowered its output cap (design.md)."""
    trip = call.trip
    spent = time.perf_counter() - call.arrival.started - trip.queue_wait - trip.upstream_time
    headers = {"x-llm-proxy-overhead-ms": f"{max(spent, 0.0) * 1000:.2f}"}
    if trip.queue_wait > 0:
        headers["x-llm-proxy-queue-ms"] = f"{trip.queue_wait * 1000:.2f}"
    if call.admission.clamped:
        headers[budgets.CLAMPED_HEADER] = "1"
    return headers


def _refusal_message(verdict: KeyVerdict) -> str:
    """What refused, its limit and when it frees, in words."""
    if verdict.budget is not None:
        return budgets.refusal_message(verdict)
    owner = "this key's team" if (verdict.code or "").startswith("team_") else "this key"
    if verdict.window is None:
        return f"Too many parallel requests on {owner}."
    window = verdict.window
    return (
        f"Rate limit reached for {describe(window)} on {owner} (limit"
        f" {window.rate.limit:g}); retry in {format_reset(verdict.retry_after)}."
    )
