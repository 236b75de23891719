"""Getting one request answered by some deployment of its model.

    order candidates (strategy) -> reserve a turn (limiter: budget + health, one step)
    -> wait for it (bounded) -> forward -> classify the answer -> settle the deployment
    (tokens, in-flight lease, health) -> on a retryable failure, the next deployment,
    then the fallback groups

When every deployment is cooling down, the request waits (within ``max_wait``) for the
first to come back; past that it gets 503 with ``retry-after`` for that moment. When they
are merely out of budget, 429 ``model_capacity`` (or ``queue_full``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

import httpx

from proxy.background import Background
from proxy.call import Call, Reply
from proxy.catalog import Catalog, DeploymentRoute, GroupRoute, deployment_limits
from proxy.config import Settings
from proxy.errors import (
    InvalidRequest,
    ProxyError,
    RateLimited,
    ServiceUnavailable,
    UpstreamError,
)
from proxy.limiter.base import (
    CooldownRule,
    DeploymentLimits,
    HealthChange,
    Limiter,
    Outcome,
)
from proxy.metrics import Metrics
from proxy.routing.outcomes import SUCCESS, classify_status, is_failure, status_error
from proxy.routing.strategies import order_candidates
from proxy.upstream.client import HEADER_MAP
from proxy.upstream.forward import TransportFailure, build_request, discard, read_body, send
from proxy.upstream.headers import response_headers
from proxy.upstream.ratelimits import UpstreamBudget, parse_budget
from proxy.upstream.sse import UsageTap, usage_of_body
from proxy.upstream.stream import StreamBody, StreamEnd

__all__ = ["Dispatcher", "StreamDone"]

logger = logging.getLogger("proxy.routing")

NEUTRAL = Outcome(kind="neutral")
# Tell the limiter what the upstream has left only when it is getting low: most answers
# then cost no extra Redis call.
SYNC_BELOW = 0.1
LATENCY_SMOOTHING = 0.2  # weight of the newest sample in the moving average

StreamDone = Callable[[int], Awaitable[None]]


class Retryable(Exception):
    """This deployment failed; another may not."""

    def __init__(self, error: UpstreamError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class Turn:
    """A reserved turn on a deployment, named by its lease."""

    deployment: DeploymentRoute
    lease: str
    probe: bool = False  # a half-open probe of a cooled deployment: its answer must count


class GateClosed(Exception):
    """The client key's check refused the request: its error is the answer as it is."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        limiter: Limiter,
        transport: httpx.AsyncBaseTransport,
        metrics: Metrics,
        background: Background,
        rng: random.Random | None = None,
    ) -> None:
        routing = settings.routing
        self.routing = routing
        # Only least-busy routing counts requests in flight (leases in the limiter).
        self.least_busy = routing.strategy == "least-busy"
        self.catalog = catalog
        self.limiter = limiter
        self.transport = transport
        self.metrics = metrics
        self.background = background
        self.rng = rng or random.Random()
        self.rule = CooldownRule(
            allowed_fails=routing.cooldown.allowed_fails,
            window=routing.cooldown.window,
            time=routing.cooldown.time,
        )
        self.waiting = 0  # requests of this replica sleeping for a turn
        self.in_flight: dict[str, int] = {}
        self.latency: dict[str, float] = {}
        # Limits lowered to what the upstream says it allows (x-ratelimit-limit-*).
        self.learned: dict[str, DeploymentLimits] = {}

    # --- the attempts ---------------------------------------------------------------

    async def run(
        self,
        call: Call,
        group: GroupRoute,
        stream_done: StreamDone,
        gate: Awaitable[object] | None = None,
    ) -> Reply:
        """The first good answer from ``group`` or its fallbacks; else the right error.

        ``gate`` (the client key's check) runs alongside the first reservation and must
        pass before anything is forwarded; if it fails, the reserved turn is given back
        and its error is the answer."""
        last_error: UpstreamError | None = None
        refusal: ProxyError | None = None
        attempts_left = self.routing.retries + 1
        for current in self._groups(group):
            tried: set[str] = set()
            while attempts_left > 0:
                candidates = [d for d in current.deployments if d.id not in tried]
                if not candidates:
                    break
                try:
                    turn = await self._reserve(call, current, candidates, gate)
                    gate = None
                except GateClosed as closed:
                    raise closed.error from None
                except (RateLimited, ServiceUnavailable) as refused:
                    refusal = refusal or refused
                    break
                attempts_left -= 1
                try:
                    return await self._attempt(call, turn, stream_done)
                except Retryable as failure:
                    last_error = failure.error
                    tried.add(turn.deployment.id)
                    call.retries += 1
        call.retries = max(call.retries - 1, 0)
        error = last_error or refusal
        assert error is not None
        raise error

    def _groups(self, group: GroupRoute) -> Iterable[GroupRoute]:
        yield group
        for name in self.catalog.fallbacks.get(group.name, []):
            fallback = self.catalog.groups.get(name)
            if fallback is not None:
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
        while True:
            ordered = order_candidates(
                self.routing.strategy,
                candidates,
                self.rng,
                in_flight=self.in_flight,
                latency=self.latency,
            )
            # A full queue still lets through a request that needs no waiting.
            queue_full = self.waiting >= self.routing.max_queue
            budget = 0.0 if queue_full else max(self.routing.max_wait - call.queue_wait, 0.0)
            lease = f"{call.request_id}.{call.retries}"
            verdict = await self.limiter.reserve_deployment(
                group.name,
                [self.learned.get(d.id, d.limits) for d in ordered],
                float(call.estimate),
                budget,
                lease_id=lease,
                least_busy=self.least_busy,
            )
            deployment = next((d for d in ordered if d.id == verdict.deployment_id), None)
            turn = None if deployment is None else Turn(deployment, lease, verdict.probe)
            queued = turn is not None and verdict.wait > 0
            if queued and self.waiting >= self.routing.max_queue:
                # The queue filled up while we asked: give the turn back.
                assert turn is not None
                self._give_back(call, turn)
                turn, queued, queue_full = None, False, True
                verdict = replace(verdict, deployment_id=None, retry_after=verdict.wait)
            if queued:
                self.waiting += 1  # counted at once: no await between check and count
            try:
                if gate is not None:
                    await self._pass_gate(call, turn, gate)
                    gate = None
            except BaseException:
                if queued:
                    self.waiting -= 1
                raise
            if turn is not None:
                if queued:
                    await self._wait(call, verdict.wait, turn, queued=True)
                return turn
            if verdict.code == "request_too_large":
                raise InvalidRequest(
                    f"This request needs about {call.estimate} tokens, more than any"
                    f" deployment of '{group.name}' accepts per minute.",
                    code="request_too_large",
                )
            if verdict.cooling and 0.0 < verdict.retry_after <= budget:
                # Every usable deployment is cooling down: wait for the first to return.
                await self._wait(call, verdict.retry_after, None)
                continue
            raise self._refusal(call, group, verdict.cooling, queue_full, verdict.retry_after)

    async def _pass_gate(self, call: Call, reserved: Turn | None, gate: Awaitable[object]) -> None:
        try:
            await gate
        except BaseException as exc:
            if reserved is not None:
                self._give_back(call, reserved)
            if isinstance(exc, Exception):
                raise GateClosed(exc) from exc
            raise

    def _refusal(
        self, call: Call, group: GroupRoute, cooling: bool, queue_full: bool, retry_after: float
    ) -> ProxyError:
        if cooling:
            self.metrics.rate_limited("model_unavailable", call.model)
            return ServiceUnavailable(
                f"Every deployment of '{group.name}' is cooling down after failures;"
                " retry after the indicated time.",
                code="model_unavailable",
                retry_after=retry_after,
            )
        scope = "queue_full" if queue_full and self.routing.max_wait > 0 else "model_capacity"
        self.metrics.rate_limited(scope, call.model)
        message = (
            f"The model '{group.name}' is at capacity; retry after the indicated time."
            if scope == "model_capacity"
            else "Too many requests are waiting in this proxy; retry shortly."
        )
        return RateLimited(message, code=scope, retry_after=retry_after)

    async def _wait(
        self,
        call: Call,
        seconds: float,
        give_back: Turn | None,
        queued: bool = False,
    ) -> None:
        """Sleep ``seconds`` as one of the waiting requests (``queued``: already counted)."""
        if not queued:
            self.waiting += 1
        self.metrics.queue_depth_add(call.model, 1)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if give_back is not None:
                self._give_back(call, give_back)
            raise
        finally:
            self.waiting -= 1
            self.metrics.queue_depth_add(call.model, -1)
        call.queue_wait += seconds
        self.metrics.queue_wait(call.model, seconds)

    # --- one upstream call ------------------------------------------------------------

    async def _attempt(self, call: Call, turn: Turn, stream_done: StreamDone) -> Reply:
        deployment = turn.deployment
        call.deployment = deployment.id
        request, added_usage = build_request(
            call.endpoint, call.body, call.raw, call.headers, deployment, call.stream
        )
        started = time.perf_counter()
        self._in_flight(call, deployment, 1)
        try:
            response = await send(self.transport, request, deployment.id)
        except TransportFailure as failure:
            self._failed(call, turn, failure, started)
            raise Retryable(failure.error) from None
        status = response.status_code
        # One plain dict: httpx's Headers scan and decode their list at every lookup.
        upstream_headers = response.extensions.get(HEADER_MAP) or dict(
            response.headers.multi_items()
        )
        self._learn(call, deployment, upstream_headers)
        if is_failure(status):
            await discard(response)
            outcome = classify_status(status, upstream_headers, time.time(), self.rule.time)
            self._finished(call, turn, outcome, str(status), started, real_tokens=0)
            error = status_error(status, deployment.id)
            error.retry_after = outcome.cool_for if status == 429 else None
            raise Retryable(error)
        headers = response_headers(upstream_headers.items())
        content_type = upstream_headers.get("content-type", "")
        if call.stream and status == 200 and "event-stream" in content_type:
            tap = UsageTap(strip_usage_event=added_usage)
            return self._stream(call, turn, response, tap, started, headers, stream_done)
        try:
            content = await read_body(response, deployment.id)
        except TransportFailure as failure:
            self._failed(call, turn, failure, started)
            raise Retryable(failure.error) from None
        # Its bookkeeping waits until the answer is on its way to the client.
        asyncio.get_running_loop().call_soon(
            self._answered, call, turn, status, content, started, time.perf_counter()
        )
        headers.setdefault("content-type", "application/json")
        return Reply(status=status, headers=headers, body=content)

    def _answered(
        self, call: Call, turn: Turn, status: int, content: bytes, started: float, ended: float
    ) -> None:
        """A buffered answer was forwarded: usage, metrics, settlement."""
        if status == 200:
            call.prompt_tokens, call.completion_tokens = usage_of_body(content)
        self._finished(call, turn, SUCCESS, str(status), started, call.real_tokens(), ended)

    def _stream(
        self,
        call: Call,
        turn: Turn,
        response: httpx.Response,
        tap: UsageTap,
        started: float,
        headers: dict[str, str],
        stream_done: StreamDone,
    ) -> Reply:
        model, dep = turn.deployment.group, turn.deployment.id

        def on_first_chunk() -> None:
            self.metrics.first_token(model, dep, time.perf_counter() - started)

        async def on_close(end: StreamEnd) -> None:
            call.prompt_tokens, call.completion_tokens = tap.prompt_tokens, tap.completion_tokens
            outcome = {
                "completed": SUCCESS,
                "interrupted": Outcome(kind="failure", reason="protocol"),
            }.get(end, NEUTRAL)
            label = "200" if end == "completed" else end
            self._finished(call, turn, outcome, label, started, call.real_tokens())
            if end == "interrupted":
                call.error_code = "stream_interrupted"
            await stream_done(200 if end != "abandoned" else 499)

        headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
        body = StreamBody(response, tap, on_first_chunk, on_close)
        return Reply(status=200, headers=headers, stream=body)

    # --- bookkeeping ------------------------------------------------------------------

    def _failed(self, call: Call, turn: Turn, failure: TransportFailure, started: float) -> None:
        outcome = Outcome(kind="failure", reason=failure.reason)
        self._finished(call, turn, outcome, failure.reason, started, real_tokens=0)

    def _finished(
        self,
        call: Call,
        turn: Turn,
        outcome: Outcome,
        label: str,
        started: float,
        real_tokens: int | None,
        ended: float | None = None,
    ) -> None:
        """An upstream call ended (at ``ended``, default now): metrics now, the limiter's
        settlement in the background."""
        deployment = turn.deployment
        duration = (ended or time.perf_counter()) - started
        self._in_flight(call, deployment, -1)
        self.metrics.upstream_finished(deployment.group, deployment.id, label, duration)
        if call.prompt_tokens or call.completion_tokens:
            self.metrics.tokens(
                deployment.group,
                deployment.id,
                call.prompt_tokens or 0,
                call.completion_tokens or 0,
            )
        if outcome.kind == "success":
            previous = self.latency.get(deployment.id, duration)
            self.latency[deployment.id] = previous + LATENCY_SMOOTHING * (duration - previous)
        elif outcome.kind == "failure":
            self.metrics.failure(deployment.group, deployment.id, outcome.reason)
            logger.warning(
                "upstream failure",
                extra={
                    "request_id": call.request_id,
                    "model": call.model,
                    "deployment": deployment.id,
                    "reason": outcome.reason,
                },
            )
        self._settle(call, turn, outcome, requests=0.0, real_tokens=real_tokens)

    def _settle(
        self,
        call: Call,
        turn: Turn,
        outcome: Outcome,
        *,
        requests: float,
        real_tokens: int | None,
    ) -> None:
        deployment = turn.deployment
        # Unknown usage (no usage in the answer) refunds the whole estimate.
        tokens = float((real_tokens or 0) - call.estimate)
        if self._changes_nothing(turn, outcome, requests, tokens):
            return  # the common case: no storage call at all

        async def settle() -> None:
            change = await self.limiter.settle_deployment(
                deployment.group,
                deployment.limits,
                lease_id=turn.lease,
                outcome=outcome,
                rule=self.rule,
                requests=requests,
                tokens=tokens,
            )
            self._report_health(deployment, outcome, change)

        self.background.run(settle())

    def _changes_nothing(
        self, turn: Turn, outcome: Outcome, requests: float, tokens: float
    ) -> bool:
        """Whether settling would leave the shared state as it is: a success that probed
        nothing, holds no in-flight lease (only least-busy keeps them) and corrects no
        budget (the deployment counts no tokens, or the estimate was exact)."""
        return (
            outcome.kind == "success"
            and not turn.probe
            and not self.least_busy
            and requests == 0
            and (tokens == 0 or turn.deployment.limits.tpm is None)
        )

    def _give_back(self, call: Call, turn: Turn) -> None:
        """A reserved turn goes unused: return it, so the next request can take it."""
        self._settle(call, turn, NEUTRAL, requests=-1.0, real_tokens=0)

    def _report_health(
        self, deployment: DeploymentRoute, outcome: Outcome, change: HealthChange
    ) -> None:
        model, dep = deployment.group, deployment.id
        if change.cooled:
            self.metrics.cooldown(model, dep, outcome.reason)
            self.metrics.set_deployment_state(model, dep, True)
            log = logger.error if outcome.reason == "auth" else logger.warning
            log(
                "deployment cooling down"
                + (": the upstream rejected its api_key" if outcome.reason == "auth" else ""),
                extra={
                    "model": model,
                    "deployment": dep,
                    "reason": outcome.reason,
                    "cooldown_s": round(change.cool_for, 3),
                    "until": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + change.cool_for)
                    ),
                },
            )
        elif change.recovered:
            self.metrics.set_deployment_state(model, dep, False)
            logger.info("deployment healthy again", extra={"model": model, "deployment": dep})

    def _learn(self, call: Call, deployment: DeploymentRoute, headers: dict[str, str]) -> None:
        """Mirror the upstream's own remaining budget; correct ours when it has less."""
        budget = parse_budget(headers, time.time())
        if budget.empty:
            return
        self._learn_limits(deployment, budget)
        model, dep = deployment.group, deployment.id
        if budget.remaining_requests is not None:
            self.metrics.set_upstream_remaining(model, dep, "requests", budget.remaining_requests)
        if budget.remaining_tokens is not None:
            self.metrics.set_upstream_remaining(model, dep, "tokens", budget.remaining_tokens)
        if _low(budget.remaining_requests, budget.limit_requests) or _low(
            budget.remaining_tokens, budget.limit_tokens
        ):
            self.background.run(
                self.limiter.sync_budget(
                    deployment.group,
                    deployment.limits,
                    remaining_requests=budget.remaining_requests,
                    reset_requests=_next_unit(
                        budget.reset_requests, budget.limit_requests, budget.remaining_requests
                    ),
                    remaining_tokens=budget.remaining_tokens,
                    reset_tokens=budget.reset_tokens,
                )
            )

    def _learn_limits(self, deployment: DeploymentRoute, budget: UpstreamBudget) -> None:
        """A configured limit above the one the upstream announces is lowered to it."""
        config = deployment.config
        lower: dict[str, int] = {}
        for field, announced in (("rpm", budget.limit_requests), ("tpm", budget.limit_tokens)):
            configured = getattr(config, field)
            if announced and configured and announced < configured:
                lower[field] = int(announced)
        current = self.learned.get(deployment.id)
        if not lower:
            return
        limits = deployment_limits(config.model_copy(update=lower), self.catalog.share)
        if limits != current:
            self.learned[deployment.id] = limits
            logger.warning(
                "deployment limit lowered to what the upstream announces",
                extra={"deployment": deployment.id, **lower},
            )

    def _in_flight(self, call: Call, deployment: DeploymentRoute, delta: int) -> None:
        self.in_flight[deployment.id] = self.in_flight.get(deployment.id, 0) + delta
        self.metrics.in_flight_add(deployment.group, deployment.id, delta)


def _next_unit(reset: float | None, limit: float | None, remaining: float | None) -> float | None:
    """When the next request frees up. Upstreams announce when their budget is *full*
    again (OpenAI: "resets to its initial state"); it refills gradually before that, one
    request about every ``reset / used``."""
    if reset is None or limit is None or remaining is None:
        return reset
    return reset / max(limit - remaining, 1.0)


def _low(remaining: float | None, limit: float | None) -> bool:
    if remaining is None:
        return False
    return remaining <= 0 or (limit is not None and remaining < SYNC_BELOW * limit)
