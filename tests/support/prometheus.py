"""Test support: a real Prometheus server, and the queries of the provisioned dashboards.

``PrometheusServer`` starts the ``prometheus`` binary (Debian/Ubuntu: ``apt-get install
prometheus``; or set ``PROMETHEUS_BIN``) on a free 127.0.0.1 port, with a generated config
scraping the given targets and its storage in a temporary directory, and stops it on exit::

    with PrometheusServer(["127.0.0.1:8000"]) as prom:
        prom.wait_for_targets_up()
        prom.wait_for('llmproxy_requests_total{model="m"}')

Tests that need it call :func:`require_prometheus` first: it skips them, with the reason,
where the binary is absent.

The dashboard helpers (:func:`dashboard_queries`, :func:`metric_names`) let a test run every
panel's PromQL against a live Prometheus, or compare the metric names with what the proxy
exposes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest

from support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS_DIR = REPO / "config" / "grafana" / "dashboards"
DATASOURCES_DIR = REPO / "config" / "grafana" / "provisioning" / "datasources"

Sample = dict[str, Any]  # one element of a Prometheus API "vector" result


def prometheus_binary() -> str | None:
    """Path of the prometheus binary: ``$PROMETHEUS_BIN``, else ``prometheus`` on PATH."""
    explicit = os.environ.get("PROMETHEUS_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("prometheus")


def require_prometheus() -> str:
    """The binary's path, or skip the calling test with the reason."""
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(
            "prometheus binary not found (apt-get install prometheus, or set PROMETHEUS_BIN)"
        )
    return binary


class PrometheusError(RuntimeError):
    pass


class PrometheusServer:
    """A throwaway Prometheus scraping ``targets`` ("host:port") every ``scrape_interval``."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        scrape_interval: str = "1s",
        metrics_path: str = "/metrics",
        job: str = "llm-proxy",
        binary: str | None = None,
    ) -> None:
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.metrics_path = metrics_path
        self.job = job
        self.binary = binary or require_prometheus()
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="llmproxy-prometheus-")
        root = Path(self._dir.name)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": self.metrics_path,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }
        # JSON is YAML: no YAML writer needed.
        (root / "prometheus.yml").write_text(json.dumps(config))
        self.port = free_port()
        log = (root / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def log_tail(self, lines: int = 30) -> str:
        if self._dir is None:
            return ""
        path = Path(self._dir.name) / "prometheus.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited at start-up:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise PrometheusError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        # A bad query is a 400/422 whose JSON body says why.
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[Sample]:
        """Instant query; the result's samples (``{"metric": {...}, "value": [t, "v"]}``).

        Raises PrometheusError for invalid PromQL. A scalar result comes back as one sample
        with no labels.
        """
        data = self._api("query", {"query": promql})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[Sample] = data["result"]
        return result

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Sample]], bool] = bool,
        timeout: float = 30.0,
        interval: float = 0.25,
    ) -> list[Sample]:
        """Poll ``promql`` until ``predicate(result)`` holds (default: a non-empty result)."""
        deadline = time.monotonic() + timeout
        result: list[Sample] = []
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise PrometheusError(f"{promql!r} still {result!r} after {timeout}s")
            time.sleep(interval)

    def targets_health(self) -> dict[str, str]:
        """Scrape URL -> "up"/"down"/"unknown" for every active target."""
        data = self._api("targets", {"state": "active"})
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            health = self.targets_health()
            if len(health) == len(self.targets) and all(h == "up" for h in health.values()):
                return
            time.sleep(0.2)
        raise PrometheusError(f"targets not up after {timeout}s: {health}")


def value(sample: Sample) -> float:
    return float(sample["value"][1])


# -- dashboards -----------------------------------------------------------------------------


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON, for every provisioned dashboard."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows; rows themselves excluded."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


@dataclass(frozen=True)
class DashboardQuery:
    dashboard: str  # file name
    panel: str  # panel title
    ref_id: str
    expr: str  # variables substituted: ready to send to Prometheus


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute_variables(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana template variables (``$x``, ``${x}``) by ``values``; ``$__...``
    built-ins like ``$__rate_interval`` become ``1m``."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name.startswith("__"):
            return "1m"
        return values[name]

    return _VARIABLE.sub(repl, expr)


def dashboard_queries(directory: Path = DASHBOARDS_DIR) -> list[DashboardQuery]:
    """Every target expr of every panel, with each template variable set to its "All"
    value (what Grafana sends when nothing is selected)."""
    queries = []
    for name, dashboard in load_dashboards(directory).items():
        variables = {
            v["name"]: v.get("allValue") or ".*"
            for v in dashboard.get("templating", {}).get("list", [])
        }
        for panel in iter_panels(dashboard):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append(
                        DashboardQuery(
                            name,
                            panel.get("title", ""),
                            target.get("refId", ""),
                            substitute_variables(target["expr"], variables),
                        )
                    )
    return queries


# Words that may stand where a metric name could, without a "(" after them.
_PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "sum", "min", "max", "avg", "group", "stddev", "stdvar"}
    | {"count", "count_values", "bottomk", "topk", "quantile", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?!\w)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names in
    matchers and groupings, strings and durations are not metric names)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for m in _IDENT.finditer(text):
        ident, is_call = m.group(1), m.group(2)
        if is_call or ident.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names


def exposed_series_names(metric_families: Sequence[Any]) -> set[str]:
    """Every series name a query may use for the given prometheus_client metric families
    (a counter family "x" is queried as x_total, a histogram as x_bucket/_sum/_count)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
    }
    return {
        family.name + suffix
        for family in metric_families
        for suffix in suffixes.get(family.type, ("",))
    }
