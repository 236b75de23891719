"""Traces (``telemetry.traces: true``): one trace per request, made from the events the
request path already reports (``routing/events.py``), beside the metrics and log lines
they move (``telemetry.py``). Imported only when traces are on: OpenTelemetry's SDK and
an OTLP exporter (``http/protobuf`` or ``grpc``), configured by the standard ``OTEL_*``
variables (endpoint, headers, timeout, compression, sampler, resource, batching).

    <operation> <model>     SERVER    the request, from its arrival to its answer
      admission             INTERNAL  from its arrival until it first waits or is sent
                                      upstream: parse, its key's and budgets' check, the
                                      first turn asked for
      wait                  INTERNAL  one wait for a turn; ``llm_proxy.wait.cause``:
                                      pacing, fair_share or cooldown
      <operation> <model>   CLIENT    one upstream attempt (first, retry or fallback);
                                      its context is the ``traceparent`` sent upstream
        stream              INTERNAL  a streamed answer, from its first chunk to its end
      settlement            INTERNAL  from the answer's end until the request's
                                      bookkeeping is done (its key settled, spend counted)

Spans take their times from the events (``perf_counter`` values, turned into the wall
clock once per process). The client's ``traceparent`` is continued. Prompts and
completions are recorded only with ``telemetry.record_content: true``; headers never
are (neither the client's key nor the deployment's), and an answer's body is read after
the upstream's key was redacted from it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import orjson
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from proxy.catalog.catalog import Catalog, DeploymentRoute
from proxy.observability.logs import RequestLog, client_text
from proxy.observability.metrics import Metrics
from proxy.observability.otlp import otlp_protocol
from proxy.observability.telemetry import Telemetry
from proxy.request.call import Call, Reply, StreamSource
from proxy.routing.events import Attempt, WaitCause
from proxy.translate import link_for

__all__ = ["RequestTrace", "StreamWatch", "TracedTelemetry", "Tracing", "start_tracing"]

SERVICE_NAME = "llm-proxy"  # unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names one
# gen_ai.operation.name per API shape (GenAI semantic conventions).
OPERATIONS = {
    "chat/completions": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
    "messages": "chat",
    "messages/count_tokens": "count_tokens",
}
# gen_ai.provider.name per configured provider.
PROVIDERS = {"openai": "openai", "azure": "azure.ai.openai", "anthropic": "anthropic"}
# The request fields holding its output cap, its prompt and its instructions, by API.
_MAX_TOKENS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_PROMPT = ("messages", "input", "prompt")
_INSTRUCTIONS = ("system", "instructions")
MAX_STREAM_TEXT = 1 << 20  # characters of a streamed answer's text kept to record
_MAX_LINE = 1 << 20  # bytes of an unfinished SSE line held while reading a stream

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """This process's tracer provider (each worker has its own): spans batched and
    exported in the background (``BatchSpanProcessor``); ``shutdown`` flushes them."""

    def __init__(self, exporter: SpanExporter, resource: Resource | None = None) -> None:
        self.provider = TracerProvider(resource=resource or process_resource())
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("llm_proxy")
        # perf_counter seconds -> nanoseconds since the epoch, for span times.
        self._offset = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf: float) -> int:
        """``perf`` (a ``time.perf_counter()`` value) as a span's timestamp."""
        return int(perf * 1e9) + self._offset

    def telemetry(
        self, metrics: Metrics, catalog: Catalog, *, record_content: bool
    ) -> TracedTelemetry:
        """A pipeline's events sink: metrics, logs and spans."""
        return TracedTelemetry(metrics, self, catalog, record_content)

    def shutdown(self) -> None:
        self.provider.shutdown()


def start_tracing() -> Tracing:
    """The provider for this process, exporting by OTLP over the protocol the
    environment names (``otlp.traces_problem`` checked it and the packages)."""
    return Tracing(_exporter(otlp_protocol()[1]))


def _exporter(protocol: str) -> SpanExporter:
    """The OTLP exporter; it reads its endpoint, headers, timeout and compression from
    the ``OTEL_EXPORTER_OTLP_[TRACES_]*`` variables."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def process_resource() -> Resource:
    """What the spans come from: ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``,
    else ``llm-proxy``, and this process as its own instance (a worker's pid)."""
    resource = Resource.create()
    attributes = resource.attributes
    extra: dict[str, AttributeValue] = {}
    if str(attributes.get("service.name", "")).startswith("unknown_service"):
        extra["service.name"] = SERVICE_NAME
    if "service.instance.id" not in attributes:
        extra["service.instance.id"] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return resource.merge(Resource(extra))


class _HeaderList(Getter[list[tuple[str, str]]]):
    """Reads the client's headers (a list of pairs) for its ``traceparent``."""

    def get(self, carrier: list[tuple[str, str]], key: str) -> list[str] | None:
        found = [value for name, value in carrier if name.lower() == key]
        return found or None

    def keys(self, carrier: list[tuple[str, str]]) -> list[str]:
        return [name for name, _ in carrier]


_HEADERS = _HeaderList()


def _trace(call: Call | None) -> RequestTrace | None:
    """``call``'s trace: ``Call.trace`` holds this module's ``RequestTrace`` (it alone
    writes it), typed ``object`` there so that a request's data knows nothing of traces."""
    return cast("RequestTrace | None", call.trace if call is not None else None)


class RequestTrace:
    """One request's spans as they are made: its root, what is open, what was read."""

    __slots__ = (
        "admitted",
        "answered_at",
        "attempt",
        "attempts",
        "body",
        "context",
        "first_token",
        "output",
        "response_model",
        "root",
        "watch",
    )

    def __init__(self, root: Span) -> None:
        self.root = root
        self.context: Context = trace.set_span_in_context(root)
        self.admitted = False  # its admission span made
        self.attempts = 0
        self.attempt: Span | None = None  # the attempt under way
        self.first_token: float | None = None  # the attempt's first chunk (perf_counter)
        self.answered_at: float | None = None  # when the last attempt ended
        self.body: bytes | None = None  # a buffered answer, read when its attempt ends
        self.watch: StreamWatch | None = None  # a streamed one, read on its way
        self.response_model: str | None = None
        self.output: str | None = None  # the answer's text (record_content only)


class TracedTelemetry(Telemetry):
    """``Telemetry`` that makes the request's spans from the same events."""

    def __init__(
        self, metrics: Metrics, tracing: Tracing, catalog: Catalog, record_content: bool
    ) -> None:
        super().__init__(metrics)
        self.tracing = tracing
        self.tracer = tracing.tracer
        self.record_content = record_content
        self.routes = {d.id: d for g in catalog.groups.values() for d in g.deployments}

    # -- the request's trace ------------------------------------------------------------

    def trace_of(self, call: Call) -> RequestTrace:
        """``call``'s trace, begun at its arrival (``call.arrival.started``) by the first event
        that needs it, continuing the client's ``traceparent`` if it sent one."""
        trace_ = _trace(call)
        if trace_ is None:
            parent = _PROPAGATOR.extract(call.arrival.headers, getter=_HEADERS)
            root = self.tracer.start_span(
                _operation(call),
                context=parent,
                kind=SpanKind.SERVER,
                start_time=self.tracing.ns(call.arrival.started),
            )
            call.trace = trace_ = RequestTrace(root)
        return trace_

    def _span(
        self,
        trace_: RequestTrace,
        name: str,
        start: float,
        end: float,
        attributes: dict[str, AttributeValue],
    ) -> None:
        """A finished child span of the request, from ``start`` to ``end``."""
        span = self.tracer.start_span(
            name, context=trace_.context, start_time=self.tracing.ns(start), attributes=attributes
        )
        span.end(end_time=self.tracing.ns(end))

    def _admitted(self, trace_: RequestTrace, call: Call, until: float) -> None:
        """The admission span, once: from the request's arrival to ``until``."""
        if trace_.admitted:
            return
        trace_.admitted = True
        if trace_.root.is_recording():
            self._span(trace_, "admission", call.arrival.started, until, admission_attributes(call))

    # -- routing.events.Events ---------------------------------------------------------

    def waited(self, call: Call, seconds: float, cause: WaitCause) -> None:
        super().waited(call, seconds, cause)
        now = time.perf_counter()
        trace_ = self.trace_of(call)
        self._admitted(trace_, call, now - seconds)
        if trace_.root.is_recording():
            attributes: dict[str, AttributeValue] = {
                "llm_proxy.wait.cause": cause,
                "llm_proxy.wait_ms": round(seconds * 1000, 3),
                "llm_proxy.key.priority": call.caller.tier,
            }
            self._span(trace_, "wait", now - seconds, now, attributes)

    def attempt_started(self, attempt: Attempt) -> None:
        super().attempt_started(attempt)
        call = attempt.call
        if call is None:
            return
        trace_ = self.trace_of(call)
        self._admitted(trace_, call, attempt.started)
        trace_.attempts += 1
        trace_.first_token, trace_.body, trace_.watch = None, None, None
        span = trace_.attempt = self._attempt_span(trace_, call, attempt)
        if attempt.headers is not None:  # the upstream continues this attempt's trace
            context = span.get_span_context()
            attempt.headers["traceparent"] = (
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            )

    def _attempt_span(self, trace_: RequestTrace, call: Call, attempt: Attempt) -> Span:
        """The attempt's span, started (a request not sampled: one without attributes,
        whose context still goes upstream, not sampled)."""
        start = self.tracing.ns(attempt.started)
        if not trace_.root.is_recording():
            return self.tracer.start_span("attempt", trace_.context, SpanKind.CLIENT)
        route = self.routes.get(attempt.deployment)
        upstream_model = _upstream_model(call, route) or attempt.model
        return self.tracer.start_span(
            f"{_operation(call)} {upstream_model}",
            context=trace_.context,
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes=attempt_attributes(call, attempt, route, trace_.attempts),
        )

    def answered(self, attempt: Attempt, reply: Reply) -> None:
        super().answered(attempt, reply)
        trace_ = _trace(attempt.call)
        if trace_ is None or not trace_.root.is_recording():
            return
        if reply.stream is None:
            trace_.body = reply.body
        else:
            trace_.watch = StreamWatch(reply.stream, self.record_content)
            reply.stream = trace_.watch

    def first_token(self, attempt: Attempt, seconds: float) -> None:
        super().first_token(attempt, seconds)
        trace_ = _trace(attempt.call)
        if trace_ is None or trace_.attempt is None:
            return
        trace_.first_token = attempt.started + seconds
        trace_.attempt.set_attribute("gen_ai.response.time_to_first_chunk", seconds)
        trace_.attempt.add_event(
            "gen_ai.first_chunk", timestamp=self.tracing.ns(trace_.first_token)
        )

    def attempt_ended(self, attempt: Attempt) -> None:
        super().attempt_ended(attempt)
        trace_ = _trace(attempt.call)
        if trace_ is None or trace_.attempt is None:
            return
        span, trace_.attempt = trace_.attempt, None
        trace_.answered_at = attempt.ended
        if span.is_recording():
            self._read_answer(trace_, attempt)
            span.set_attributes(attempt_end_attributes(attempt, trace_.response_model))
            if attempt.outcome.kind == "failure":
                span.set_status(Status(StatusCode.ERROR, attempt.outcome.reason))
            if trace_.first_token is not None:
                stream = self.tracer.start_span(
                    "stream",
                    context=trace.set_span_in_context(span),
                    start_time=self.tracing.ns(trace_.first_token),
                    attributes={"llm_proxy.stream.end": attempt.label},
                )
                stream.end(end_time=self.tracing.ns(attempt.ended))
        span.end(end_time=self.tracing.ns(attempt.ended))

    def _read_answer(self, trace_: RequestTrace, attempt: Attempt) -> None:
        """The response's model (and text, when recording content) from the answer the
        attempt passed on: its body, or what its stream showed on the way."""
        if trace_.watch is not None:
            trace_.response_model = trace_.watch.model
            trace_.output = trace_.watch.text() if self.record_content else None
        elif trace_.body is not None and attempt.label == "200":
            answer = _json(trace_.body)
            model = answer.get("model")
            trace_.response_model = model if isinstance(model, str) else None
            trace_.output = output_text(answer) if self.record_content else None
        trace_.body, trace_.watch = None, None

    def request_finished(self, line: RequestLog, duration: float, call: Call) -> None:
        super().request_finished(line, duration, call)
        now = time.perf_counter()
        trace_ = self.trace_of(call)
        end = call.arrival.started + duration
        self._admitted(trace_, call, end)  # refused before a wait or an attempt
        if trace_.attempt is not None:  # never heard ending: it ends with the request
            trace_.attempt.end(end_time=self.tracing.ns(end))
        root = trace_.root
        if root.is_recording():
            if trace_.answered_at is not None:
                self._span(
                    trace_, "settlement", trace_.answered_at, now, settlement_attributes(call)
                )
            route = self.routes.get(line.deployment or "")
            attributes = request_attributes(line, call, route, trace_.response_model)
            if self.record_content:
                attributes.update(content_attributes(call, trace_.output))
            root.update_name(f"{_operation(call)} {line.model}")
            root.set_attributes(attributes)
            if line.status >= 500:
                root.set_status(Status(StatusCode.ERROR, line.error_code or str(line.status)))
        root.end(end_time=self.tracing.ns(end))


# --- attributes ----------------------------------------------------------------------


def _present(attributes: dict[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    """Attributes without the absent ones (OpenTelemetry takes no None)."""
    return {name: value for name, value in attributes.items() if value is not None}


def _operation(call: Call) -> str:
    return OPERATIONS.get(call.arrival.shape.name, call.arrival.shape.name)


def _max_tokens(call: Call) -> int | None:
    for field in _MAX_TOKENS:
        value = call.ask.body.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _upstream_model(call: Call, route: DeploymentRoute | None) -> str | None:
    """The model an attempt on ``route`` asks its upstream for: the deployment's, or
    the client's own name (a pattern group's deployment without ``model:``: bounded,
    printable, as the log line quotes it)."""
    if route is None:
        return None
    return route.model_for(call.arrival.shape.name) or call.ask.requested_model


def _provider(route: DeploymentRoute | None) -> str | None:
    if route is None:
        return None
    return PROVIDERS.get(route.config.provider, route.config.provider)


def admission_attributes(call: Call) -> dict[str, AttributeValue]:
    """The key's check: who, and what it said (``allowed``, ``refused`` with the limit
    that refused, ``shadow`` for a shadow key's refusal that went on; ``none``: no key
    check, an unlimited key)."""
    verdict = call.admission.verdict
    if verdict is None:
        result = "none"
    elif call.admission.shadow_rejection is not None:
        result = "shadow"
    else:
        result = "allowed" if verdict.allowed else "refused"
    return _present(
        {
            "llm_proxy.key.name": call.caller.key_name,
            "llm_proxy.team": call.caller.team or None,
            "llm_proxy.key.verdict": result,
            "llm_proxy.key.limit": None if verdict is None else verdict.code,
            "llm_proxy.shadow_rejection": call.admission.shadow_rejection,
        }
    )


def _upstream_url(call: Call, route: DeploymentRoute | None) -> httpx.URL | None:
    """Where an attempt goes: the deployment's URL of the client's API, or of the one
    its request is translated to (proxy/translate)."""
    if route is None:
        return None
    if route.speaks(call.arrival.shape.name):
        return route.target(call.arrival.shape.name)[0]
    link = link_for(call.arrival.shape.name, route.speaks)
    return None if link is None else route.target(link.upstream.name)[0]


def attempt_attributes(
    call: Call, attempt: Attempt, route: DeploymentRoute | None, number: int
) -> dict[str, AttributeValue]:
    """An attempt's, as it starts: the GenAI call it is and where it goes."""
    kind = "fallback" if attempt.model != call.ask.model else "retry" if number > 1 else "first"
    url = _upstream_url(call, route)
    return _present(
        {
            "gen_ai.operation.name": _operation(call),
            "gen_ai.provider.name": _provider(route),
            "gen_ai.request.model": _upstream_model(call, route),
            "gen_ai.request.max_tokens": _max_tokens(call),
            "gen_ai.request.stream": call.ask.stream,
            "server.address": None if url is None else url.host,
            "server.port": None if url is None else url.port,
            "llm_proxy.request_id": call.arrival.request_id,
            "llm_proxy.model": attempt.model,
            "llm_proxy.deployment": attempt.deployment,
            "llm_proxy.attempt": number,
            "llm_proxy.attempt.kind": kind,
        }
    )


def attempt_end_attributes(attempt: Attempt, model: str | None) -> dict[str, AttributeValue]:
    """An attempt's, as it ends: the upstream's status (or the failure's reason), what
    it meant for the deployment, the usage it reported."""
    status = int(attempt.label) if attempt.label.isdigit() else None
    failed = attempt.outcome.kind == "failure"
    return _present(
        {
            "http.response.status_code": status,
            "error.type": attempt.outcome.reason or attempt.label if failed else None,
            "llm_proxy.outcome": attempt.outcome.kind,
            "llm_proxy.outcome.reason": attempt.outcome.reason or None,
            "gen_ai.response.model": model if status == 200 else None,
            "gen_ai.usage.input_tokens": attempt.prompt_tokens,
            "gen_ai.usage.output_tokens": attempt.completion_tokens,
        }
    )


def settlement_attributes(call: Call) -> dict[str, AttributeValue]:
    """What the request was charged: the usage the upstream reported, else what it is
    charged without it (its estimate, or a stream's at least)."""
    trip = call.trip
    charged = trip.charged_tokens()
    return _present(
        {
            "llm_proxy.usage.reported": trip.usage is not None,
            "llm_proxy.tokens.estimated": call.ask.estimate,
            "llm_proxy.tokens.charged": charged,
        }
    )


def request_attributes(
    line: RequestLog, call: Call, route: DeploymentRoute | None, model: str | None
) -> dict[str, AttributeValue]:
    """The request's, once answered: what its log line says, in the GenAI semantic
    conventions' names where they have one (the proxy's own under ``llm_proxy.``)."""
    asked = call.ask.body.get("model")
    return _present(
        {
            "gen_ai.operation.name": _operation(call),
            "gen_ai.provider.name": _provider(route),
            "gen_ai.request.model": client_text(asked) if isinstance(asked, str) else line.model,
            "gen_ai.response.model": model,
            "gen_ai.request.max_tokens": _max_tokens(call),
            "gen_ai.request.stream": call.ask.stream,
            "gen_ai.usage.input_tokens": line.prompt_tokens,
            "gen_ai.usage.output_tokens": line.completion_tokens,
            "http.response.status_code": line.status,
            "error.type": line.error_code if line.status >= 500 else None,
            "llm_proxy.request_id": line.request_id,
            "llm_proxy.api": line.api,
            "llm_proxy.model": line.model,
            "llm_proxy.key.name": line.key_name,
            "llm_proxy.team": call.caller.team or None,
            "llm_proxy.deployment": line.deployment,
            "llm_proxy.queue_time_ms": line.queue_wait_ms,
            "llm_proxy.cost_usd": line.cost_usd,
            "llm_proxy.retries": line.retries,
            "llm_proxy.error_code": line.error_code,
            "llm_proxy.shadow_rejection": line.shadow_rejection,
        }
    )


def content_attributes(call: Call, output: str | None) -> dict[str, AttributeValue]:
    """The prompt and the answer's text (``telemetry.record_content: true`` only): the
    request's messages (or input, or prompt) and instructions as the client sent them,
    as JSON; the answer's text as one assistant message."""
    prompt = next((call.ask.body[f] for f in _PROMPT if f in call.ask.body), None)
    instructions = next((call.ask.body[f] for f in _INSTRUCTIONS if f in call.ask.body), None)
    answer = None
    if output is not None:
        answer = [{"role": "assistant", "parts": [{"type": "text", "content": output}]}]
    return _present(
        {
            "gen_ai.input.messages": None if prompt is None else _dumps(prompt),
            "gen_ai.system_instructions": None if instructions is None else _dumps(instructions),
            "gen_ai.output.messages": None if answer is None else _dumps(answer),
        }
    )


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def _json(body: bytes) -> dict[str, Any]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


# --- an answer's text ----------------------------------------------------------------


def _texts(items: object, *path: str) -> list[str]:
    """The strings at ``path`` in each dict of the list ``items``."""
    found: list[str] = []
    for item in items if isinstance(items, list) else ():
        value: object = item
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            found.append(value)
    return found


def output_text(answer: dict[str, Any]) -> str | None:
    """A buffered answer's text: chat's messages, completions' texts, Anthropic's text
    blocks, the Responses API's output text (None: none, as an embedding's)."""
    choices = answer.get("choices")
    texts = _texts(choices, "message", "content") + _texts(choices, "text")
    texts += _texts(answer.get("content"), "text")
    for item in answer.get("output") or () if isinstance(answer.get("output"), list) else ():
        texts += _texts(item.get("content") if isinstance(item, dict) else None, "text")
    return "".join(texts) if texts else None


def delta_text(event: dict[str, Any]) -> str:
    """The text one streamed event adds: a chat chunk's delta, a completion chunk's
    text, Anthropic's text delta, the Responses API's output text delta."""
    choices = event.get("choices")
    texts = _texts(choices, "delta", "content") + _texts(choices, "text")
    kind = event.get("type")
    if kind == "content_block_delta":
        texts += _texts([event], "delta", "text")
    elif kind == "response.output_text.delta":
        texts += _texts([event], "delta")
    return "".join(texts)


def model_of(event: dict[str, Any]) -> str | None:
    """The model a streamed event names: a chunk's own, Anthropic's ``message_start``'s,
    the Responses API's ``response``'s."""
    for found in (
        _texts([event], "model"),
        _texts([event], "message", "model"),
        _texts([event], "response", "model"),
    ):
        if found:
            return found[0]
    return None


class StreamWatch:
    """A streamed answer passed on chunk by chunk as it is, its events read on the way
    for the model that answers (until found) and, when recording content, its text
    (at most ``MAX_STREAM_TEXT`` characters)."""

    def __init__(self, source: StreamSource, content: bool) -> None:
        self.source = source
        self.content = content
        self.model: str | None = None
        self._parts: list[str] = []
        self._size = 0
        self._rest = b""  # an unfinished line

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.source:
            if self.model is None or self.content:
                self._read(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.source.aclose()

    def text(self) -> str | None:
        return "".join(self._parts) if self._parts else None

    def _read(self, chunk: bytes) -> None:
        lines = (self._rest + chunk).split(b"\n")
        rest = lines.pop()
        self._rest = rest if len(rest) <= _MAX_LINE else b""
        for line in lines:
            if line.startswith(b"data:"):
                event = _json(line[5:])
                if self.model is None:
                    self.model = model_of(event)
                if self.content and self._size < MAX_STREAM_TEXT:
                    text = delta_text(event)[: MAX_STREAM_TEXT - self._size]
                    self._parts.append(text)
                    self._size += len(text)
