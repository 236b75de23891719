"""The provisioned Grafana dashboards and the Prometheus config are valid and only use
metrics the proxy exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from itertools import combinations
from typing import Any

import pytest
import yaml
from support.prometheus import (
    DASHBOARDS_DIR,
    DATASOURCES_DIR,
    REPO,
    PrometheusServer,
    dashboard_queries,
    exposed_series_names,
    iter_panels,
    load_dashboards,
    metric_names,
    require_prometheus,
)

from proxy.observability.metrics import Metrics

DASHBOARDS = load_dashboards()
PROVISIONING = REPO / "config" / "grafana" / "provisioning"


def provisioned_datasources() -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = []
    for path in sorted(DATASOURCES_DIR.glob("*.y*ml")):
        sources += yaml.safe_load(path.read_text())["datasources"]
    return sources


def exposed_names() -> set[str]:
    return exposed_series_names(list(Metrics().registry.collect()))


def datasource_refs(dashboard: dict[str, Any]) -> list[tuple[str, Any]]:
    """(where, datasource) for every panel, target and template variable."""
    refs: list[tuple[str, Any]] = []
    for panel in iter_panels(dashboard):
        refs.append((f"panel {panel.get('title')!r}", panel.get("datasource")))
        refs += [
            (f"panel {panel.get('title')!r} target {t.get('refId')}", t.get("datasource"))
            for t in panel.get("targets", [])
        ]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            refs.append((f"variable {var['name']}", var.get("datasource")))
    return refs


def test_the_three_dashboards_exist() -> None:
    assert {d["uid"] for d in DASHBOARDS.values()} >= {
        "llmproxy-overview",
        "llmproxy-deployments",
        "llmproxy-limiter",
    }


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_provisionable(name: str) -> None:
    dashboard = DASHBOARDS[name]
    assert dashboard["title"]
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert 36 <= dashboard["schemaVersion"] <= 41
    # A fixed id would clash with whatever Grafana has already stored.
    assert dashboard.get("id") is None


def test_dashboard_uids_are_unique() -> None:
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(uids) == len(set(uids))


def test_the_datasource_has_a_fixed_uid_and_points_at_prometheus() -> None:
    (source,) = provisioned_datasources()
    assert source == source | {
        "uid": "prometheus",
        "type": "prometheus",
        "url": "http://prometheus:9090",
    }


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_datasource_reference_resolves_to_the_provisioned_one(name: str) -> None:
    provisioned = {(s["type"], s["uid"]) for s in provisioned_datasources()}
    for where, ref in datasource_refs(DASHBOARDS[name]):
        assert isinstance(ref, dict), f"{name}: {where} has no datasource"
        assert (ref.get("type"), ref.get("uid")) in provisioned, f"{name}: {where}: {ref}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panel_ids_are_unique(name: str) -> None:
    ids = [p["id"] for p in iter_panels(DASHBOARDS[name])]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_fit_the_grid_without_overlap(name: str) -> None:
    boxes = {p["title"]: p["gridPos"] for p in iter_panels(DASHBOARDS[name])}
    for title, g in boxes.items():
        assert g["x"] >= 0 and g["y"] >= 0 and g["w"] > 0 and g["h"] > 0, title
        assert g["x"] + g["w"] <= 24, f"{title} is wider than the 24-column grid"

    def overlap(a: dict[str, int], b: dict[str, int]) -> bool:
        return (
            a["x"] < b["x"] + b["w"]
            and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"]
            and b["y"] < a["y"] + a["h"]
        )

    for (ta, a), (tb, b) in combinations(boxes.items(), 2):
        assert not overlap(a, b), f"{ta!r} overlaps {tb!r}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_has_a_title_a_query_and_a_unit(name: str) -> None:
    for panel in iter_panels(DASHBOARDS[name]):
        title = panel.get("title")
        assert title, f"{name}: panel {panel.get('id')} has no title"
        exprs = [t.get("expr") for t in panel.get("targets", [])]
        assert exprs and all(exprs), f"{name}: {title!r} lacks a query"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: {title!r} has no unit"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{name}: {title!r} repeats a refId"


def test_queries_use_one_minute_rate_windows() -> None:
    for q in dashboard_queries():
        for window in re.findall(r"\b(?:rate|increase)\([^\[]*\[([^\]]+)\]", q.expr):
            assert window in ("1m", "5m"), f"{q.dashboard}: {q.panel!r}: [{window}]"


def test_every_metric_a_query_uses_is_exposed_by_the_proxy() -> None:
    exposed = exposed_names()
    for q in dashboard_queries():
        unknown = metric_names(q.expr) - exposed
        assert not unknown, f"{q.dashboard}: {q.panel!r}: {sorted(unknown)} in {q.expr}"


def test_template_variables_query_exposed_metrics() -> None:
    exposed = exposed_names()
    for name, dashboard in DASHBOARDS.items():
        for var in dashboard.get("templating", {}).get("list", []):
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, f"{name}: variable {var['name']}: {var['definition']}"
            assert metric_names(m.group(1)) <= exposed, f"{name}: {var['definition']}"


def test_every_metric_of_the_proxy_is_on_some_dashboard() -> None:
    used = set().union(*(metric_names(q.expr) for q in dashboard_queries()))
    missing = {
        family.name
        for family in Metrics().registry.collect()
        if not exposed_series_names([family]) & used
    }
    assert not missing


def test_metric_names_are_parsed_out_of_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, model) (rate(a_seconds_bucket{model=~"$m", '
        'status=~"5.."}[1m]))) / on (model) group_left (kind) (b_total or vector(0)) * 60 '
        "> bool c offset 5m"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}


def test_the_dashboards_provider_loads_the_mounted_dashboards_directory() -> None:
    config = yaml.safe_load((PROVISIONING / "dashboards" / "dashboards.yml").read_text())
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    # docker-compose mounts config/grafana/dashboards here.
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert DASHBOARDS_DIR.is_dir()


def test_prometheus_scrapes_both_proxy_replicas_every_5s() -> None:
    config = yaml.safe_load((REPO / "config" / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    (job,) = config["scrape_configs"]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["proxy-1:8000", "proxy-2:8000"]
    assert job.get("metrics_path", "/metrics") == "/metrics"


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", str(REPO / "config" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_prometheus_parses_every_dashboard_query() -> None:
    require_prometheus()
    with PrometheusServer([]) as prom:
        for q in dashboard_queries():
            prom.query(q.expr)  # raises PrometheusError on a syntax error
