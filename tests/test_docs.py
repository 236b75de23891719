"""The docs say what the code does: where a test can read both, it compares them."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route
from support.prometheus import dashboard_queries, metric_names

from proxy.config.settings import RedisConfig
from proxy.limiter import factory
from proxy.observability.metrics import Metrics
from proxy.process.app import create_app
from proxy.process.demo import demo_settings

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#+ ", text[start:], re.M)
    return text[start : start + following.start()] if following else text[start:]


# --- README: the endpoints ---------------------------------------------------------------


def _served() -> set[str]:
    """``METHOD /path`` of every route the app serves (path parameters as ``{name}``)."""
    app: Any = create_app(demo_settings("http://127.0.0.1:9")).app  # built, not started
    served = set()
    for route in app.router.routes:
        assert isinstance(route, Route), route
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        served |= {f"{method} {path}" for method in route.methods or () if method != "HEAD"}
    return served


def test_every_endpoint_the_router_serves_is_in_the_readmes_list_and_no_other() -> None:
    listed = _section((ROOT / "README.md").read_text(), "### Endpoints")
    documented = set(re.findall(r"^\| `([A-Z]+ /[^`]*)`", listed, re.M))
    served = _served()
    assert served - documented == set(), "served, missing from the README's ### Endpoints"
    assert documented - served == set(), "in the README's ### Endpoints, not served"


# --- observability.md: the metrics -------------------------------------------------------

_SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def _metrics_table() -> dict[str, str]:
    """observability.md's table of metrics: name -> type."""
    text = (DOCS / "observability.md").read_text()
    return dict(re.findall(r"^\| `(llmproxy_\w+)` \| (\w+) \|", text, re.M))


def test_observability_md_lists_every_metric_the_proxy_exports_with_its_type() -> None:
    exported = {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in Metrics().registry.collect()
    }
    assert _metrics_table() == exported


def test_every_metric_the_dashboards_query_is_in_observability_md() -> None:
    queried = set().union(*(metric_names(q.expr) for q in dashboard_queries()))
    families = {re.sub("(" + "|".join(_SERIES_SUFFIXES) + ")$", "", n) for n in queried}
    assert families - set(_metrics_table()) == set()
    assert {"llmproxy_tier_queue_wait_seconds", "llmproxy_tier_queue_depth"} <= families


# --- limiter.md: Redis timeouts ----------------------------------------------------------


class _Built(Exception):
    """Stops create_limiter once it has chosen the Redis limiter's timeouts."""


def test_limiter_md_states_the_redis_timeouts_of_the_default_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `redis.timeout`'s default makes of a Redis limiter's timeouts, read where the
    factory hands them over (nothing connects)."""
    chosen: dict[str, float] = {}

    def capture(url: str, **options: float) -> None:
        chosen.update(options)
        raise _Built

    monkeypatch.setattr(factory, "RedisLimiter", capture)
    with pytest.raises(_Built):
        factory.create_limiter("redis://127.0.0.1:9", timeout=RedisConfig().timeout)
    row = re.search(
        r"^\| Redis timeouts \| connect ([\d.]+) s, socket ([\d.]+) s, whole operation"
        r" ([\d.]+) s",
        (DOCS / "limiter.md").read_text(),
        re.M,
    )
    assert row is not None
    documented = [float(row.group(i)) for i in (1, 2, 3)]
    in_code = [chosen["connect_timeout"], chosen["socket_timeout"], chosen["op_timeout"]]
    assert documented == pytest.approx(in_code)


# --- production.md's sizing: benchmarks.md's figures -------------------------------------


def _real_traffic(figure: str) -> str:
    """The median of ``figure`` in benchmarks.md's first real-traffic table (the
    upstream answering at once)."""
    text = (DOCS / "benchmarks.md").read_text()
    row = re.search(rf"^\| {re.escape(figure)} \| \+?([\d,.]+)", text, re.M)
    assert row is not None, figure
    return row.group(1)


def _one_key_req_per_s() -> str:
    text = (DOCS / "benchmarks.md").read_text()
    row = re.search(
        r"^\| proxy, Redis, 2 workers, one key, one deployment at 6,000,000 rpm"
        r" \| 64 \| ([\d,]+) \|",
        text,
        re.M,
    )
    assert row is not None
    return row.group(1)


def test_production_md_sizing_quotes_what_benchmarks_md_measures() -> None:
    """The sizing figures are the last `make bench`'s: real traffic at 64 and 256
    connections, the latency added at one, and the one-key row."""
    sizing = _section((DOCS / "production.md").read_text(), "## Sizing the proxy")
    sizing = " ".join(sizing.split())
    figures = re.search(
        r"was forwarded at ([\d,]+) requests a second at 64 connections and ([\d,]+) at"
        r" 256, and the proxy added ([\d.]+) ms at the median at one connection; one key"
        r" and one deployment far from its limit, two workers, ([\d,]+)\.",
        sizing,
    )
    assert figures is not None, sizing
    at_64, at_256, added, one_key = figures.groups()
    assert at_64 == _real_traffic("req/s at 64 connections")
    assert at_256 == _real_traffic("req/s at 256 connections")
    assert added == _real_traffic("added p50 at 1 connection (vs. direct)")
    assert one_key == _one_key_req_per_s()


def test_architecture_md_is_one_page_naming_every_package() -> None:
    """docs/architecture.md is one page a newcomer reads: at most about 120 lines, none over
    120 characters, and its table names every package under proxy/ (each with the one-line
    docstring that says its job), so a new package cannot go unmapped."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    lines = doc.splitlines()
    assert len(lines) <= 120
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120] == []
    package = ROOT / "proxy"
    packages = sorted(p.parent for p in package.glob("*/__init__.py"))
    assert packages
    unnamed = [p.name for p in packages if f"`{p.name}/`" not in doc]
    assert unnamed == []
    undocumented = [
        p.name
        for p in packages
        if not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
    ]
    assert undocumented == []
