"""The bench's traces switch (``BENCH_TRACES=1``, loadtest/bench/otlp_sink.py): off, the
replicas' config is as it was; on, a real sink process takes what an OTLP/HTTP exporter
sends (and drops it), and the config and environment point the replicas at it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from loadtest.bench.otlp_sink import ENV, report, with_traces
from loadtest.bench.servers import Processes

CONFIG: dict[str, object] = {"models": [{"name": "m", "deployments": []}]}


def test_off_the_config_is_left_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    procs = Processes(tmp_path)
    assert with_traces(procs, CONFIG) is CONFIG
    lines: list[str] = []
    report(procs, lines.append)
    assert lines == [] and procs.started == []


@pytest.mark.slow
def test_on_the_replicas_export_to_a_sink_that_drops_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "1")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    procs = Processes(tmp_path)
    try:
        config = with_traces(procs, CONFIG)
        assert config == {**CONFIG, "telemetry": {"traces": True}}
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # reads the env
        with provider.get_tracer("bench-test").start_as_current_span("one"):
            pass
        provider.shutdown()
        lines: list[str] = []
        report(procs, lines.append)
        received = json.loads(lines[0].split(": ", 1)[1])
        assert received["exports"] == 1 and received["bytes"] > 0
        assert os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    finally:
        procs.stop_all()
