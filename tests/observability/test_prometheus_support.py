"""The Prometheus test helper works: a real Prometheus scrapes a Metrics() registry."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.prometheus import (
    PrometheusError,
    PrometheusServer,
    free_port,
    require_prometheus,
    value,
)

from proxy.observability.metrics import Metrics


def serve_metrics(metrics: Metrics) -> ThreadingHTTPServer:
    """A tiny /metrics endpoint on 127.0.0.1, serving ``metrics.render()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# One server for the module: Prometheus batches target discovery, so its first scrape comes
# about 5 s after start-up. Tests use distinct label values instead of fresh servers.
@pytest.fixture(scope="module")
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture(scope="module")
def scraped(metrics: Metrics) -> Iterator[PrometheusServer]:
    require_prometheus()
    server = serve_metrics(metrics)
    try:
        with PrometheusServer([f"127.0.0.1:{server.server_address[1]}"]) as prom:
            prom.wait_for_targets_up()
            yield prom
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_recorded_counter_can_be_queried(metrics: Metrics, scraped: PrometheusServer) -> None:
    for _ in range(3):
        metrics.request_finished("gpt-test", 200, 0.2)

    result = scraped.wait_for('llmproxy_requests_total{model="gpt-test", status="200"}')

    assert [value(s) for s in result] == [3.0]
    assert result[0]["metric"]["job"] == "llm-proxy"


def test_later_values_show_up_on_the_next_scrape(
    metrics: Metrics, scraped: PrometheusServer
) -> None:
    metrics.init_deployment("gpt-later", "dep-a", rpm=60, tpm=1000)
    scraped.wait_for('llmproxy_deployment_state{deployment="dep-a"}')

    metrics.set_deployment_state("gpt-later", "dep-a", True)

    result = scraped.wait_for('llmproxy_deployment_state{deployment="dep-a"} == 1')
    assert result[0]["metric"]["model"] == "gpt-later"


def test_invalid_promql_raises_with_prometheus_s_reason(scraped: PrometheusServer) -> None:
    with pytest.raises(PrometheusError, match="parse error"):
        scraped.query("sum by (")


def test_a_scalar_result_is_one_unlabelled_sample(scraped: PrometheusServer) -> None:
    assert [value(s) for s in scraped.query("scalar(vector(2))")] == [2.0]
