"""Which OTLP exporter traces (``telemetry.traces: true``) would use, and what stops them,
read from the environment and the installed packages without importing OpenTelemetry."""

from __future__ import annotations

import importlib.util
import os

# The OTLP exporter per protocol (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL), what it needs.
OTLP_EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}
OTEL_EXTRA = "llm-proxy[otel]"


def otlp_protocol() -> tuple[str, str]:
    """The variable that names the OTLP protocol of traces, and the protocol (the
    OpenTelemetry default, ``http/protobuf``, when neither is set)."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip().lower()
        if value:
            return name, value
    return "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"


def traces_problem() -> str | None:
    """One line if traces (``telemetry.traces: true``) cannot be exported: a protocol
    the Python exporters do not speak, or the OpenTelemetry packages not installed (the
    ``otel`` extra). Imports nothing of them but their packages' ``__init__``."""
    name, protocol = otlp_protocol()
    exporter = OTLP_EXPORTERS.get(protocol)
    if exporter is None:
        return (
            f"{name}={protocol!r}: OpenTelemetry's Python exporter sends traces over"
            " http/protobuf or grpc; set one of them (or unset it: http/protobuf)"
        )
    for module in ("opentelemetry.sdk.trace", exporter):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # its package is missing
            found = False
        if not found:
            return (
                f"telemetry.traces: true needs the OpenTelemetry SDK and OTLP exporters"
                f" ({module} is missing): pip install '{OTEL_EXTRA}'"
            )
    return None
