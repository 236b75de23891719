"""Real OTLP trace receivers on 127.0.0.1 for tests: what the proxy's exporter sends,
decoded with ``opentelemetry-proto`` into plain spans to assert on.

``OtlpHttpReceiver``: ``POST /v1/traces`` (http/protobuf, gzip or not), a thread of this
process. ``OtlpGrpcReceiver``: the OTLP gRPC trace service (grpcio). Both keep every span
they get; ``wait_for`` polls them, bounded.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["OtlpGrpcReceiver", "OtlpHttpReceiver", "ReceivedSpan", "Spans"]

SERVER, CLIENT, INTERNAL = 2, 3, 1  # span kinds as OTLP numbers them
STATUS_ERROR = 2


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    start: int  # ns since the epoch
    end: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    resource: dict[str, Any] = field(default_factory=dict)

    def texts(self) -> Iterator[str]:
        """Every value this span carries, as text (to look for what must not be there)."""
        yield self.name
        for value in self.attributes.values():
            yield str(value)
        for name, attributes in self.events:
            yield name
            yield from (str(v) for v in attributes.values())


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class Spans:
    """The spans received so far, from any number of exports."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.exports = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            status_code=span.status.code,
                            resource=resource,
                        )
                    )
        with self._lock:
            self._spans.extend(spans)
            self.exports += 1

    def all(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0
    ) -> list[ReceivedSpan]:
        """Every span received, once ``found`` says they are enough; fails after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.all()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not received in {timeout}s; got {len(spans)}")
            time.sleep(0.02)

    def request(self, request_id: str, spans_at_least: int = 1) -> list[ReceivedSpan]:
        """The spans of the trace whose root is the request ``request_id``, once its
        root and at least ``spans_at_least`` spans of it have come."""

        def of_request(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
            roots = [s for s in spans if s.attributes.get("llm_proxy.request_id") == request_id]
            roots = [s for s in roots if s.kind == SERVER]
            if not roots:
                return []
            return [s for s in spans if s.trace_id == roots[0].trace_id]

        spans = self.wait_for(lambda spans: len(of_request(spans)) >= spans_at_least)
        return of_request(spans)


class _Handler(BaseHTTPRequestHandler):
    spans: Spans

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.spans.add(request)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtlpHttpReceiver:
    """OTLP/HTTP: ``url`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self) -> None:
        self.spans = Spans()
        handler = type("Handler", (_Handler,), {"spans": self.spans})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpHttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class OtlpGrpcReceiver:
    """OTLP/gRPC (grpcio): ``url`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.spans = Spans()
        spans = self.spans

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                spans.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpGrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(timeout=10)
