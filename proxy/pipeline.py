"""The life of one API request, from client key to upstream answer and back.

    authenticate -> parse -> key budget -> [reserve a deployment -> wait for its turn ->
    forward]* (retries, fallbacks) -> reply (buffered or streamed) -> settle budgets

Every step that can fail raises a ``ProxyError``; ``handle`` turns it into the contract's
reply, so no path answers without ``x-request-id`` and the key's rate-limit headers.
Budgets are settled exactly once per request (``Settlement``), whether it succeeds,
fails, or the client goes away mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy import tokens
from proxy.auth import KeyStore
from proxy.catalog import Catalog, DeploymentRoute, GroupRoute
from proxy.config import Settings
from proxy.errors import (
    InvalidRequest,
    ModelNotFound,
    ProxyError,
    RateLimited,
    ServiceUnavailable,
    UpstreamError,
    UpstreamUnavailable,
    render,
)
from proxy.limiter.base import (
    KeyLimits,
    KeyVerdict,
    Limiter,
    LimiterUnavailable,
    StorageError,
    Usage,
)
from proxy.logs import RequestLog, log_request
from proxy.metrics import Metrics
from proxy.ratelimit_headers import format_reset
from proxy.routing.strategies import order_candidates
from proxy.upstream.errors import map_transport_error
from proxy.upstream.headers import request_headers, response_headers
from proxy.upstream.sse import UsageTap

__all__ = ["Pipeline", "Reply", "StreamBody"]

logger = logging.getLogger("proxy.pipeline")

_JSON = {"content-type": "application/json"}


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: StreamBody | None = None


@dataclass(slots=True)
class Call:
    """What the pipeline knows about one request as it goes."""

    request_id: str
    endpoint: str
    started: float
    key_name: str | None = None
    model: str = "unknown"  # a configured name once known: safe as a metric label
    body: dict[str, Any] = field(default_factory=dict)
    raw: bytes = b""
    stream: bool = False
    estimate: int = 0
    deployment: str | None = None
    queue_wait: float = 0.0
    retries: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error_code: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)

    def real_tokens(self) -> int | None:
        """Tokens the upstream reported (prompt + completion), if it did."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


class Retryable(Exception):
    """A failure another deployment may not have: try the next one."""

    def __init__(self, error: UpstreamError) -> None:
        super().__init__(error.message)
        self.error = error


class Settlement:
    """Gives back what a request took from the budgets, exactly once."""

    def __init__(self, run: Callable[[int | None], Awaitable[None]]) -> None:
        self._run = run
        self._done = False

    async def settle(self, real_tokens: int | None) -> None:
        if self._done:
            return
        self._done = True
        await self._run(real_tokens)


class StreamBody:
    """A streamed upstream answer, passed through chunk by chunk.

    ``aclose`` closes the upstream response and settles the budgets even when iteration
    never started (the client left before the first byte).
    """

    def __init__(
        self,
        response: httpx.Response,
        tap: UsageTap,
        on_first_chunk: Callable[[], None],
        on_close: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._response = response
        self._tap = tap
        self._on_first_chunk = on_first_chunk
        self._on_close = on_close
        self._closed = False
        self._completed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        first = True
        try:
            async for chunk in self._response.aiter_raw():
                if first:
                    first = False
                    self._on_first_chunk()
                out = self._tap.feed(chunk)
                if out:
                    yield out
            rest = self._tap.flush()
            if rest:
                yield rest
            self._completed = True
        except httpx.HTTPError:
            # The upstream broke off mid-stream: a stream is never retried after its first
            # byte, so end it with an SSE error event the OpenAI SDK raises as an APIError.
            yield _sse_error("The upstream stream was interrupted.")
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._response.aclose()
        except Exception:  # closing a broken connection may fail; nothing to return
            logger.debug("closing upstream stream failed", exc_info=True)
        await self._on_close(self._completed)

    @property
    def tap(self) -> UsageTap:
        return self._tap


def _sse_error(message: str) -> bytes:
    payload = orjson.dumps(
        {"error": {"message": message, "type": "api_error", "param": None, "code": "stream_error"}}
    )
    return b"data: " + payload + b"\n\n"


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        transport: httpx.AsyncBaseTransport,
        metrics: Metrics,
        share: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = Catalog(settings, share)
        self.keys = KeyStore(settings.keys)
        self.limiter = limiter
        self.transport = transport
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.waiting = 0
        self.in_flight: dict[str, int] = {}
        self._background: set[asyncio.Task[None]] = set()

    # --- entry point ----------------------------------------------------------------

    async def handle(
        self, endpoint: str, raw: bytes, headers: list[tuple[str, str]], authorization: str | None
    ) -> Reply:
        call = Call(
            request_id=f"req_{uuid.uuid4().hex}",
            endpoint=endpoint,
            started=time.perf_counter(),
            headers=headers,
        )
        key_verdict: KeyVerdict | None = None
        settlement: Settlement | None = None
        reply: Reply
        try:
            key = self.keys.authenticate(authorization)
            if key is not None:
                call.key_name = key.name
            call.body, call.raw = _parse_body(raw), raw
            group = self._group(call.body)
            call.model = group.name
            self.keys.authorize(key, group.name)
            call.stream = call.body.get("stream") is True
            call.estimate = tokens.estimate(
                call.body, endpoint, self.settings.server.default_max_tokens
            )
            limits = self.catalog.key_limits.get(key.name) if key is not None else None
            if limits is not None:
                key_verdict = await self._acquire_key(call, limits)
                settlement = self._key_settlement(call, limits)
            reply = await self._dispatch(call, group, settlement)
        except ProxyError as error:
            reply = self._error_reply(call, error)
        except (LimiterUnavailable, StorageError):
            unavailable = ServiceUnavailable(
                "The shared rate limiter is unavailable; retry shortly.",
                code="limiter_unavailable",
                retry_after=1.0,
            )
            reply = self._error_reply(call, unavailable)
        except Exception:  # a bug must still answer in the contract's shape
            logger.exception("unexpected error", extra={"request_id": call.request_id})
            reply = self._error_reply(call, ProxyError("Internal proxy error."))
        if reply.stream is None and settlement is not None:
            self._in_background(settlement.settle(call.real_tokens()))
        reply.headers["x-request-id"] = call.request_id
        if key_verdict is not None:
            reply.headers.update(_key_headers(key_verdict))
        if reply.stream is None:
            self._finish(call, reply.status)
        return reply

    def reject(self, endpoint: str, error: ProxyError) -> Reply:
        """The reply for a request refused before its body was read (size, type)."""
        call = Call(
            request_id=f"req_{uuid.uuid4().hex}", endpoint=endpoint, started=time.perf_counter()
        )
        reply = self._error_reply(call, error)
        reply.headers["x-request-id"] = call.request_id
        self._finish(call, reply.status)
        return reply

    # --- steps ------------------------------------------------------------------------

    def _group(self, body: dict[str, Any]) -> GroupRoute:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest(
                "'model' is required and must be a string.", code="missing_model", param="model"
            )
        group = self.catalog.groups.get(model)
        if group is None:
            raise ModelNotFound(f"The model '{model[:200]}' does not exist.", param="model")
        return group

    async def _acquire_key(self, call: Call, limits: KeyLimits) -> KeyVerdict:
        verdict = await self.limiter.acquire_key(limits, call.request_id, call.estimate)
        if not verdict.allowed:
            code = verdict.code or "rate_limited"
            self.metrics.rate_limited(code, call.model)
            if code == "request_too_large":
                raise InvalidRequest(
                    f"This request needs about {call.estimate} tokens, more than the key"
                    f" '{limits.name}' may ever use at once; lower max_tokens or the input.",
                    code="request_too_large",
                )
            raise RateLimited(
                _KEY_MESSAGES.get(code, "Rate limit reached."),
                code=code,
                retry_after=verdict.retry_after,
            )
        return verdict

    def _key_settlement(self, call: Call, limits: KeyLimits) -> Settlement:
        async def run(real_tokens: int | None) -> None:
            correction = (real_tokens if real_tokens is not None else 0) - call.estimate
            await self.limiter.release_key(limits, call.request_id, float(correction))

        return Settlement(run)

    async def _dispatch(
        self, call: Call, group: GroupRoute, settlement: Settlement | None
    ) -> Reply:
        """Try the group's deployments (then its fallbacks) until one answers."""
        last: UpstreamError | None = None
        attempts_left = self.settings.routing.retries + 1
        for current in self._groups_to_try(group):
            tried: set[str] = set()
            while attempts_left > 0:
                candidates = [d for d in current.deployments if d.id not in tried]
                if not candidates:
                    break
                deployment = await self._reserve(call, current, candidates)
                attempts_left -= 1
                try:
                    return await self._forward(call, deployment, settlement)
                except Retryable as failure:
                    last = failure.error
                    tried.add(deployment.id)
                    call.retries += 1
        call.retries = max(call.retries - 1, 0)
        assert last is not None
        raise last

    def _groups_to_try(self, group: GroupRoute) -> Iterable[GroupRoute]:
        yield group
        for name in self.catalog.fallbacks.get(group.name, []):
            fallback = self.catalog.groups.get(name)
            if fallback is not None:
                yield fallback

    async def _reserve(
        self, call: Call, group: GroupRoute, candidates: list[DeploymentRoute]
    ) -> DeploymentRoute:
        """Reserve budget on a deployment and wait for its turn (bounded)."""
        routing = self.settings.routing
        ordered = order_candidates(routing.strategy, candidates, self.rng, in_flight=self.in_flight)
        # A full queue still lets through a request that needs no waiting.
        max_wait = routing.max_wait if self.waiting < routing.max_queue else 0.0
        verdict = await self.limiter.reserve_deployment(
            group.name, [d.limits for d in ordered], float(call.estimate), max_wait
        )
        if verdict.deployment_id is None:
            if verdict.code == "request_too_large":
                raise InvalidRequest(
                    f"This request needs about {call.estimate} tokens, more than any"
                    f" deployment of '{group.name}' accepts per minute.",
                    code="request_too_large",
                )
            scope = "queue_full" if max_wait == 0.0 and routing.max_wait > 0 else "model_capacity"
            self.metrics.rate_limited(scope, call.model)
            raise RateLimited(
                f"The model '{group.name}' is at capacity; retry after the indicated time."
                if scope == "model_capacity"
                else "Too many requests are waiting for this proxy; retry shortly.",
                code=scope,
                retry_after=verdict.retry_after,
            )
        deployment = next(d for d in ordered if d.id == verdict.deployment_id)
        if verdict.wait > 0:
            await self._wait_turn(call, deployment, verdict.wait)
        return deployment

    async def _wait_turn(self, call: Call, deployment: DeploymentRoute, wait: float) -> None:
        self.waiting += 1
        self.metrics.queue_depth_add(call.model, 1)
        try:
            await asyncio.sleep(wait)
        except asyncio.CancelledError:
            # The turn goes unused: give it back so the next request can take it.
            self._in_background(
                self.limiter.correct_deployment(
                    deployment.group, deployment.limits, -1.0, -float(call.estimate)
                )
            )
            raise
        finally:
            self.waiting -= 1
            self.metrics.queue_depth_add(call.model, -1)
        call.queue_wait += wait
        self.metrics.queue_wait(call.model, wait)

    async def _forward(
        self, call: Call, deployment: DeploymentRoute, settlement: Settlement | None
    ) -> Reply:
        call.deployment = deployment.id
        strip_usage = False
        body = call.body
        payload = call.raw
        if deployment.upstream_model != call.model or (call.stream and _wants_usage(body)):
            body = dict(body)
            body["model"] = deployment.upstream_model
            if call.stream and _wants_usage(body):
                # Usage settles the token budget; the client gets the stream it asked for.
                body["stream_options"] = {
                    **(body.get("stream_options") or {}),
                    "include_usage": True,
                }
                strip_usage = True
            payload = orjson.dumps(body)
        request = httpx.Request(
            "POST",
            deployment.url(call.endpoint),
            content=payload,
            headers=request_headers(call.headers, deployment.config.api_key.get_secret_value()),
            extensions={"timeout": deployment.timeouts},
        )
        return await self._exchange(call, deployment, request, strip_usage, settlement)

    async def _exchange(
        self,
        call: Call,
        deployment: DeploymentRoute,
        request: httpx.Request,
        strip_usage: bool,
        settlement: Settlement | None,
    ) -> Reply:
        model, dep = call.model, deployment.id
        started = time.perf_counter()
        self._in_flight_add(model, dep, 1)
        try:
            response = await self.transport.handle_async_request(request)
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            self._in_flight_add(model, dep, -1)
            error, reason = map_transport_error(exc, dep)
            self._upstream_failed(call, deployment, reason, started, settlement)
            raise Retryable(error) from None
        status = response.status_code
        if status == 429 or status >= 500 or status in (401, 403):
            await _discard(response)
            self._in_flight_add(model, dep, -1)
            self._upstream_failed(call, deployment, str(status), started, settlement)
            raise Retryable(_upstream_status_error(status, dep))
        headers = response_headers(response.headers.multi_items())
        if (
            call.stream
            and status == 200
            and "event-stream" in response.headers.get("content-type", "")
        ):
            return self._stream_reply(
                call, deployment, response, strip_usage, started, headers, settlement
            )
        try:
            content = await response.aread()
        except httpx.HTTPError as exc:
            self._in_flight_add(model, dep, -1)
            error, reason = map_transport_error(exc, dep)
            self._upstream_failed(call, deployment, reason, started, settlement)
            raise Retryable(error) from None
        finally:
            await response.aclose()
        self._in_flight_add(model, dep, -1)
        self.metrics.upstream_finished(model, dep, str(status), time.perf_counter() - started)
        self._record_usage(call, deployment, _usage(content) if status == 200 else (None, None))
        if "content-type" not in headers:
            headers["content-type"] = "application/json"
        return Reply(status=status, headers=headers, body=content)

    def _stream_reply(
        self,
        call: Call,
        deployment: DeploymentRoute,
        response: httpx.Response,
        strip_usage: bool,
        started: float,
        headers: dict[str, str],
        settlement: Settlement | None,
    ) -> Reply:
        model, dep = call.model, deployment.id
        tap = UsageTap(strip_usage)

        def on_first_chunk() -> None:
            self.metrics.first_token(model, dep, time.perf_counter() - started)

        async def on_close(completed: bool) -> None:
            self._in_flight_add(model, dep, -1)
            status = "200" if completed else "interrupted"
            self.metrics.upstream_finished(model, dep, status, time.perf_counter() - started)
            usage = (tap.prompt_tokens, tap.completion_tokens)
            self._record_usage(call, deployment, usage)
            if settlement is not None:
                await settlement.settle(call.real_tokens())
            self._finish(call, 200 if completed else 499)

        headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
        return Reply(
            status=200,
            headers=headers,
            stream=StreamBody(response, tap, on_first_chunk, on_close),
        )

    # --- bookkeeping ----------------------------------------------------------------

    def _record_usage(
        self, call: Call, deployment: DeploymentRoute, usage: tuple[int | None, int | None]
    ) -> None:
        prompt, completion = usage
        call.prompt_tokens, call.completion_tokens = prompt, completion
        if prompt is not None or completion is not None:
            self.metrics.tokens(call.model, deployment.id, prompt or 0, completion or 0)
        real = call.real_tokens()
        if deployment.limits.tpm is not None:
            correction = (real if real is not None else 0) - call.estimate
            if correction:
                self._in_background(
                    self.limiter.correct_deployment(
                        deployment.group, deployment.limits, 0.0, float(correction)
                    )
                )

    def _upstream_failed(
        self,
        call: Call,
        deployment: DeploymentRoute,
        reason: str,
        started: float,
        settlement: Settlement | None,
    ) -> None:
        self.metrics.upstream_finished(
            call.model, deployment.id, reason, time.perf_counter() - started
        )
        self.metrics.failure(call.model, deployment.id, reason)
        logger.warning(
            "upstream failure",
            extra={"request_id": call.request_id, "deployment": deployment.id, "reason": reason},
        )
        if deployment.limits.tpm is not None:
            # Nothing was generated: the reserved tokens go back.
            self._in_background(
                self.limiter.correct_deployment(
                    deployment.group, deployment.limits, 0.0, -float(call.estimate)
                )
            )

    def _in_flight_add(self, model: str, deployment: str, delta: int) -> None:
        self.in_flight[deployment] = self.in_flight.get(deployment, 0) + delta
        self.metrics.in_flight_add(model, deployment, delta)

    def _error_reply(self, call: Call, error: ProxyError) -> Reply:
        status, body, headers = render(error)
        call.error_code = error.code
        return Reply(status=status, headers={**_JSON, **headers}, body=body)

    def _finish(self, call: Call, status: int) -> None:
        duration = time.perf_counter() - call.started
        self.metrics.request_finished(call.model, status, duration)
        log_request(
            RequestLog(
                request_id=call.request_id,
                key_name=call.key_name,
                model=call.model,
                deployment=call.deployment,
                status=status,
                latency_ms=round(duration * 1000, 2),
                queue_wait_ms=round(call.queue_wait * 1000, 2),
                prompt_tokens=call.prompt_tokens,
                completion_tokens=call.completion_tokens,
                retries=call.retries,
                error_code=call.error_code,
            )
        )

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(self._guard(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception:  # bookkeeping must never take the process down
            logger.warning("budget settlement failed", exc_info=True)

    async def drain(self) -> None:
        """Wait for pending bookkeeping (at shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


_KEY_MESSAGES = {
    "key_rpm": "Rate limit reached for requests per minute on this key.",
    "key_tpm": "Rate limit reached for tokens per minute on this key.",
    "key_parallel": "Too many parallel requests on this key.",
}


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_body")
    return body


def _wants_usage(body: dict[str, Any]) -> bool:
    """True when the client did not ask for the final usage chunk itself."""
    options = body.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


def _usage(content: bytes) -> tuple[int | None, int | None]:
    try:
        usage = orjson.loads(content).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None, None
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


async def _discard(response: httpx.Response) -> None:
    try:
        await response.aread()
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()


def _upstream_status_error(status: int, deployment: str) -> UpstreamError:
    if status == 429:
        return ServiceUnavailable(
            f"The upstream deployment '{deployment}' is rate limited.", code="upstream_rate_limited"
        )
    if status in (401, 403):
        return UpstreamUnavailable(
            f"The upstream deployment '{deployment}' rejected the proxy's credentials.",
            code="upstream_auth_error",
        )
    return UpstreamUnavailable(
        f"The upstream deployment '{deployment}' answered with status {status}.",
        code="upstream_error",
    )


def _key_headers(verdict: KeyVerdict) -> dict[str, str]:
    headers: dict[str, str] = {}
    for kind, usage in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if usage is not None:
            headers.update(_usage_headers(kind, usage))
    return headers


def _usage_headers(kind: str, usage: Usage) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(int(usage.limit)),
        f"x-ratelimit-remaining-{kind}": str(max(int(usage.remaining), 0)),
        f"x-ratelimit-reset-{kind}": format_reset(usage.reset),
    }
