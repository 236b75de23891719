"""Where the request path's events become metrics and log lines.

The dispatcher and the pipeline report what happened (``routing/events.py``); this is
the one place that decides which metrics move and what is logged for it, so neither the
control flow nor the metrics registry knows about the other. With ``telemetry.traces``
on, ``proxy/observability/tracing.py``'s subclass hears the same events and makes spans of them too;
off, that module (and OpenTelemetry with it) is never imported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from proxy.catalog.catalog import Catalog
from proxy.config.settings import Settings
from proxy.limiter.base import HealthChange, Outcome
from proxy.observability.logs import RequestLog, log_request
from proxy.observability.metrics import Metrics
from proxy.providers.ratelimits import UpstreamBudget
from proxy.request.call import Call, Reply
from proxy.routing.events import Attempt, WaitCause

__all__ = ["Telemetry", "Tracer", "close_tracing", "telemetry_for"]

logger = logging.getLogger("proxy.routing")


class Telemetry:
    """Implements ``routing.events.Events`` over the metrics and the logs."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    # -- one request -----------------------------------------------------------------

    def request_finished(self, line: RequestLog, duration: float, call: Call) -> None:
        self.metrics.request_finished(line.model, line.status, duration, line.api)
        log_request(line)

    def spent(self, key: str, team: str, model: str, usd: float) -> None:
        self.metrics.spend(key, team, model, usd)

    def budget_left(self, owner: str, budget: str, remaining: float) -> None:
        """What a budget (a key's, a team's) had left at its latest check."""
        self.metrics.set_owner_budget_remaining(owner, budget, remaining)

    # -- routing.events.Events ---------------------------------------------------------

    def attempt_started(self, attempt: Attempt) -> None:
        self.metrics.in_flight_add(attempt.model, attempt.deployment, 1)

    def answered(self, attempt: Attempt, reply: Reply) -> None:
        pass  # metrics and logs read an answer when its attempt ends

    def first_token(self, attempt: Attempt, seconds: float) -> None:
        self.metrics.first_token(attempt.model, attempt.deployment, seconds)

    def usage_unreadable(self, shape: str, attempt: Attempt) -> None:
        self.metrics.usage_unreadable(shape, attempt.deployment)
        logger.warning(
            "usage unreadable",
            extra={
                "request_id": attempt.request_id,
                "shape": shape,
                "model": attempt.model,
                "deployment": attempt.deployment,
            },
        )

    def attempt_ended(self, attempt: Attempt) -> None:
        model, deployment = attempt.model, attempt.deployment
        self.metrics.in_flight_add(model, deployment, -1)
        self.metrics.upstream_finished(model, deployment, attempt.label, attempt.duration)
        if attempt.prompt_tokens or attempt.completion_tokens:
            self.metrics.tokens(
                model, deployment, attempt.prompt_tokens or 0, attempt.completion_tokens or 0
            )
        if attempt.outcome.kind == "failure":
            reason = attempt.outcome.reason
            self.metrics.failure(model, deployment, reason)
            logger.warning(
                "upstream failure",
                extra={
                    "request_id": attempt.request_id,
                    "model": model,
                    "deployment": deployment,
                    "reason": reason,
                },
            )

    def health_changed(
        self, model: str, deployment: str, outcome: Outcome, change: HealthChange
    ) -> None:
        if change.cooled:
            self.metrics.cooldown(model, deployment, outcome.reason)
            self.metrics.set_deployment_state(model, deployment, True)
            auth = outcome.reason == "auth"
            (logger.error if auth else logger.warning)(
                "deployment cooling down" + (": the upstream rejected its api_key" if auth else ""),
                extra={
                    "model": model,
                    "deployment": deployment,
                    "reason": outcome.reason,
                    "cooldown_s": round(change.cool_for, 3),
                    "until": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + change.cool_for)
                    ),
                },
            )
        elif change.recovered:
            self.metrics.set_deployment_state(model, deployment, False)
            logger.info(
                "deployment healthy again", extra={"model": model, "deployment": deployment}
            )

    def upstream_budget(self, model: str, deployment: str, budget: UpstreamBudget) -> None:
        for kind, left in (
            ("requests", budget.remaining_requests),
            ("tokens", budget.remaining_tokens),
        ):
            if left is not None:
                self.metrics.set_upstream_remaining(model, deployment, kind, left)

    def limits_announced(self, deployment: str, lowered: dict[str, int]) -> None:
        logger.warning(
            "deployment limit lowered to what the upstream announces",
            extra={"deployment": deployment, **lowered},
        )

    def queued(self, model: str, delta: int, tier: str) -> None:
        self.metrics.queue_depth_add(model, delta, tier)

    def waited(self, call: Call, seconds: float, cause: WaitCause) -> None:
        self.metrics.queue_wait(call.ask.model, seconds, call.caller.tier)

    def refused(self, scope: str, model: str) -> None:
        self.metrics.rate_limited(scope, model)

    def shadow_refused(self, key: str, limit: str) -> None:
        """A shadow key's own ``limit`` would have refused a request; it went on (its
        request log line says so too)."""
        self.metrics.shadow_rejection(key, limit)


class Tracer(Protocol):
    """What a pipeline's telemetry needs of the process's tracer provider
    (``tracing.Tracing``, imported only when traces are on)."""

    def telemetry(self, metrics: Metrics, catalog: Catalog, *, record_content: bool) -> Telemetry:
        """A pipeline's events sink: metrics, logs and spans."""
        ...

    def shutdown(self) -> None:
        """The spans still batched exported, then the exporter closed."""
        ...


async def close_tracing(tracing: Tracer | None) -> None:
    """At shutdown: the spans still batched exported, then the exporter closed (in a
    thread: an unreachable collector holds it up to its timeout)."""
    if tracing is not None:
        await asyncio.to_thread(tracing.shutdown)


def telemetry_for(
    metrics: Metrics, tracing: Tracer | None, settings: Settings, catalog: Catalog
) -> Telemetry:
    """A pipeline's events sink: metrics and logs, and spans too when tracing is on."""
    if tracing is None:
        return Telemetry(metrics)
    return tracing.telemetry(metrics, catalog, record_content=settings.telemetry.record_content)
