"""One call to a deployment, as a value: build, send, classify the answer, read what its
headers say of the upstream's budget (through the provider) and its usage (through the
API shape), redact the upstream's key. The routing layer decides what to do with the
``Answer``: settle, retry, learn.

    build (forward.build_request: model, the shape's needs, credentials)
    -> send (one transport)  -> a failure status: discarded, classified (outcomes)
                             -> a stream: StreamBody, its usage read on the way (sse)
                             -> a body: read whole (bounded), redacted; an answer that
                                says the deployment is misconfigured (the provider) or
                                no API answers there (unshaped): a failure
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from proxy.call import Reply
from proxy.catalog import DeploymentRoute
from proxy.costs import TokenUsage
from proxy.errors import ProxyError, UpstreamError
from proxy.limiter.base import SUCCESS, Outcome, Remaining
from proxy.routing.outcomes import (
    admitted,
    classify_status,
    is_failure,
    misconfigured_error,
    status_error,
    unshaped,
    unshaped_error,
)
from proxy.shapes.base import Shape
from proxy.shapes.sse import UsageTap
from proxy.upstream.encoding import Undecodable, decoder_for
from proxy.upstream.forward import (
    TransportFailure,
    UnusableAnswer,
    build_request,
    discard,
    read_body,
    send,
    undecodable,
)
from proxy.upstream.headers import response_headers
from proxy.upstream.interface import HEADER_MAP, UpstreamRequest
from proxy.upstream.ratelimits import UpstreamBudget, remaining_report
from proxy.upstream.redact import StreamRedactor, redact, redact_headers, redactable
from proxy.upstream.stream import StreamBody, StreamEnd

__all__ = ["Answer", "Exchange", "StreamEnd", "StreamEnded", "build_request"]

logger = logging.getLogger("proxy.upstream")

# A stream ended (how), with the usage its shape read (None: none) and the events passed.
StreamEnded = Callable[[StreamEnd, TokenUsage | None, int], Awaitable[None]]

_NO_BUDGET = UpstreamBudget()


@dataclass(slots=True)
class Answer:
    """What one call to a deployment came to.

    ``reply`` is what the client gets; None: a failure (``error``, tried elsewhere when
    ``retry``) or an answer that cannot be passed on (``error`` as it is). ``label``:
    the status, or the failure's reason (metrics). ``outcome``: its meaning for the
    deployment's health. ``refund``: the upstream did not admit the request (its token
    charge goes back). ``budget`` and ``remaining``: what its headers said of the
    upstream's budget, and what the limiter should hear of it (None: nothing)."""

    label: str
    outcome: Outcome
    upstream_time: float  # seconds waited on the upstream (to the headers, a body's read)
    reply: Reply | None = None
    error: ProxyError | None = None
    retry: bool = False
    refund: bool = False
    budget: UpstreamBudget = _NO_BUDGET
    remaining: Remaining | None = None
    ended: float | None = None  # perf_counter when a buffered answer was read
    shape: Shape | None = None  # a buffered 200's, whose usage it reads (``usage``)
    _usage: TokenUsage | None = field(default=None, repr=False)
    _read: bool = field(default=False, repr=False)

    @property
    def usage(self) -> TokenUsage | None:
        """A buffered 200's usage, read by its shape once, when first asked (after the
        answer is on its way); None: none, or not readable."""
        if not self._read:
            self._read = True
            if self.shape is not None and self.reply is not None:
                self._usage = self.shape.usage(self.reply.body)
        return self._usage


class Exchange:
    """Calls deployments over one transport. ``max_answer``: a buffered body's bound;
    ``max_hold``: the longest a 429 or an upstream's budget holds a deployment;
    ``cooldown_time``: how long a misconfigured one cools."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        max_answer: int | None,
        max_hold: float,
        cooldown_time: float,
    ) -> None:
        self.transport = transport
        self.max_answer = max_answer
        self.max_hold = max_hold
        self.cooldown_time = cooldown_time

    async def call(
        self,
        shape: Shape,
        deployment: DeploymentRoute,
        request: UpstreamRequest,
        strip_usage: bool,
        stream: bool,
        started: float,
        on_first_chunk: Callable[[], None],
        on_stream_end: StreamEnded,
    ) -> Answer:
        """Send ``request`` (built by ``build_request``, sent at ``started``:
        perf_counter) and what its answer came to. A streamed answer's end is reported
        to ``on_stream_end``."""
        try:
            response = await send(self.transport, request, deployment.id)
        except TransportFailure as failure:
            return _failed(failure, time.perf_counter() - started)
        upstream_time = time.perf_counter() - started  # to its headers
        status = response.status_code
        # One plain dict: httpx's Headers scan and decode their list at every lookup.
        upstream_headers = response.extensions.get(HEADER_MAP) or dict(
            response.headers.multi_items()
        )
        now = time.time()
        budget = deployment.provider.budget(upstream_headers, now)
        remaining = self._remaining(deployment, budget)
        if is_failure(status):
            await discard(response)
            outcome = classify_status(
                status, upstream_headers, budget, now, self.cooldown_time, self.max_hold
            )
            error = status_error(status, deployment.id)
            error.retry_after = outcome.cool_for if status == 429 else None
            return Answer(
                str(status), outcome, upstream_time, None, error, True, False, budget, remaining
            )
        secret = redactable(deployment.config.api_key.get_secret_value())
        headers = redact_headers(response_headers(upstream_headers.items()), secret.decode())
        content_type = upstream_headers.get("content-type", "")
        if stream and status == 200 and "event-stream" in content_type:
            try:
                decoder = decoder_for(upstream_headers.get("content-encoding"))
            except Undecodable as exc:
                await discard(response)
                unusable = undecodable(deployment.id, exc)
                return _unusable(unusable, upstream_time, budget, remaining)
            tap = UsageTap(shape.stream_usage(), strip_usage_event=strip_usage)

            async def on_close(end: StreamEnd) -> None:
                await on_stream_end(end, tap.usage, body.events)

            body = StreamBody(
                response,
                tap,
                StreamRedactor(secret),
                on_first_chunk,
                on_close,
                shape.stream_error,
                decoder,
            )
            headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
            reply = Reply(status=200, headers=headers, stream=body)
            return Answer("200", SUCCESS, upstream_time, reply, budget=budget, remaining=remaining)
        headers_at = time.perf_counter()
        try:
            content = await read_body(response, deployment.id, self.max_answer)
        except TransportFailure as failure:
            answer = _failed(failure, upstream_time)
            answer.budget, answer.remaining = budget, remaining
            return answer
        except UnusableAnswer as unusable:
            return _unusable(unusable, upstream_time, budget, remaining)
        content = redact(content, secret)
        ended = time.perf_counter()
        upstream_time += ended - headers_at  # and its body
        asked = deployment.model_for(shape.name) is None  # the client's name went
        wrong = deployment.provider.misconfigured(status, content, self.cooldown_time, asked)
        if wrong is not None:  # not the client's fault: cool it as a bad key is cooled
            error = misconfigured_error(status, deployment.id)
            refund = not admitted(status)
            return Answer(
                str(status), wrong, upstream_time, None, error, True, refund, budget, remaining
            )
        odd = unshaped(status, content, self.cooldown_time)
        if odd is not None:  # no API answer: the contract's shape instead
            shaped = unshaped_error(status, deployment.id, _shown(request.url))
            retry = isinstance(shaped, UpstreamError)  # no LLM API there: try another
            if retry:
                logger.warning("%s (%s)", shaped.message, content_type or "no content-type")
            return Answer(
                str(status), odd, upstream_time, None, shaped, retry, False, budget, remaining
            )
        headers.setdefault("content-type", "application/json")
        reply = Reply(status=status, headers=headers, body=content)
        return Answer(
            str(status),
            SUCCESS,
            upstream_time,
            reply,
            refund=not admitted(status),
            budget=budget,
            remaining=remaining,
            ended=ended,
            shape=shape if status == 200 else None,
        )

    def _remaining(self, deployment: DeploymentRoute, budget: UpstreamBudget) -> Remaining | None:
        """What the limiter should hear of the upstream's budget (None: nothing)."""
        if budget.empty:
            return None
        # Azure announces no limits: what is left is judged against the configured ones.
        config = deployment.config
        return remaining_report(budget.assuming(config.rpm, config.tpm), self.max_hold)


def _failed(failure: TransportFailure, upstream_time: float) -> Answer:
    """No (complete) HTTP answer: retried elsewhere."""
    outcome = Outcome("failure", failure.reason)
    return Answer(failure.reason, outcome, upstream_time, None, failure.error, retry=True)


def _unusable(
    unusable: UnusableAnswer,
    upstream_time: float,
    budget: UpstreamBudget,
    remaining: Remaining | None,
) -> Answer:
    """An answer that cannot be passed on (over the size bound, undecodable): another
    deployment would send the same, so no retry and no harm to this one's health; its
    tokens were spent upstream (the estimate stays charged)."""
    outcome = Outcome("neutral", unusable.reason)
    return Answer(
        unusable.reason,
        outcome,
        upstream_time,
        None,
        unusable.error,
        budget=budget,
        remaining=remaining,
    )


def _shown(url: httpx.URL) -> str:
    """An upstream URL as messages and logs show it: without credentials or a query."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"
