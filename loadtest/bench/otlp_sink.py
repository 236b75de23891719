"""Traces on in the real-traffic rows (``BENCH_TRACES=1``): the work tree's replicas run
with ``telemetry.traces: true`` and export by OTLP/HTTP to a sink the bench starts here,
which reads every export and drops it (an empty ``ExportTraceServiceResponse``, 200), so
the figures are the proxy's cost of making and exporting its spans, not a collector's.

    BENCH_TRACES=1 python -m loadtest.bench --only real ...

``python -m loadtest.bench.otlp_sink --port N`` serves it; ``GET /stats``: exports and
bytes received (what shows that spans did leave the replicas).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from loadtest.bench.servers import Processes
from loadtest.topology import LOOPBACK, free_port

ENV = "BENCH_TRACES"


class _Sink(BaseHTTPRequestHandler):
    exports = 0
    received = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", "0"))
        self.rfile.read(size)
        with self.lock:
            _Sink.exports += 1
            _Sink.received += size
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = f'{{"exports": {_Sink.exports}, "bytes": {_Sink.received}}}'.encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def wanted() -> bool:
    return os.environ.get(ENV, "").strip() not in ("", "0")


def with_traces(procs: Processes, config: dict[str, object]) -> dict[str, object]:
    """``config`` as it is, or (``BENCH_TRACES=1``) with traces on, exported to a sink
    started now: the replicas started after this inherit its ``OTEL_*`` variables."""
    if not wanted():
        return config
    port = free_port()
    procs.start(
        "otlp-sink", [sys.executable, "-m", "loadtest.bench.otlp_sink", "--port", str(port)]
    )
    url = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"{url}/stats", timeout=1).close()  # noqa: S310 (loopback)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the OTLP sink did not start") from None
            time.sleep(0.05)
    os.environ.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "llm-proxy-bench",
        }
    )
    print(f"traces on: exported to the OTLP sink at {url} (read and dropped)")
    return {**config, "telemetry": {"traces": True}}


def report(procs: Processes, log: Callable[[str], None]) -> None:
    """Log what the sink received so far (nothing when traces are off)."""
    if "otlp-sink" not in procs.named:
        return
    port = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rsplit(":", 1)[1]
    url = f"http://{LOOPBACK}:{port}/stats"
    with urllib.request.urlopen(url, timeout=2) as answer:
        log(f"OTLP sink received: {answer.read().decode()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.otlp_sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    ThreadingHTTPServer((LOOPBACK, args.port), _Sink).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
