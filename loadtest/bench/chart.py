"""The chart beside docs/benchmarks.md (matplotlib, installed by `make bench` only).

One horizontal bar per target, its label in full on its row (bars side by side under
long labels overlapped them), in two panels sharing the rows: req/s at 64 connections
(the target a dashed line, named in the panel's title: a label beside the line sat on
a bar) and the median latency at 1 connection.

    python -m loadtest.bench.chart docs/benchmarks.md

draws it again from the figures a page holds (its "Throughput and latency" table),
without running the bench: after a change to the drawing.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loadtest.bench.model import PEER, TARGET_RPS, TARGETS, BenchReport, Run, Target, TargetResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["figure", "results_from_markdown", "write_chart"]

_GREY, _ORANGE, _BLUE = "#888888", "#dd8452", "#3b75af"  # direct, the peer, this proxy


def write_chart(report: BenchReport, path: Path) -> None:
    """Two bar charts: req/s at 64 connections, p50 at 1 connection, one bar per target."""
    _save(figure(report.results), path)


def figure(results: Sequence[TargetResult]) -> Figure:
    """The chart of ``results`` (one row each, in their order, the first at the top)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: draw to a file
    import matplotlib.pyplot as plt

    labels = [r.target.label.replace("direct to the fake upstream", "direct") for r in results]
    rps = [r.runs[64].rps if 64 in r.runs else 0.0 for r in results]
    p50 = [r.runs[1].p50_ms if 1 in r.runs else 0.0 for r in results]
    colors = [
        _GREY if r.target.backend is None else _ORANGE if r.target.peer else _BLUE for r in results
    ]
    rows = list(range(len(results)))
    fig, (left, right) = plt.subplots(
        1, 2, sharey=True, figsize=(12, 1.4 + 0.42 * len(results)), width_ratios=(3, 2)
    )
    left.barh(rows, rps, color=colors)
    left.axvline(TARGET_RPS, color="#c44e52", linestyle="--", linewidth=1)
    left.set_title(f"requests/s at 64 connections (dashed: the target, {TARGET_RPS:,.0f})")
    right.barh(rows, p50, color=colors)
    right.set_title("median latency (ms) at 1 connection")
    for axis, values, spec in ((left, rps, ",.0f"), (right, p50, ".2f")):
        for row, figure_ in zip(rows, values, strict=True):
            axis.text(figure_, row, f" {figure_:{spec}}", ha="left", va="center", fontsize=8)
        axis.set_xlim(0, max(values, default=0.0) * 1.18 or 1.0)  # room for the figures
        axis.tick_params(axis="y", labelsize=8)
        axis.tick_params(axis="x", labelsize=8)
    left.xaxis.set_major_formatter("{x:,.0f}")
    left.set_yticks(rows, labels)
    left.invert_yaxis()  # the first target at the top
    fig.suptitle("llm-proxy: non-streamed chat completions via wrk (direct vs. through the proxy)")
    fig.tight_layout(w_pad=3)  # the panels' last and first x labels apart
    return fig


def _save(fig: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


# A row of the page's "Throughput and latency" table (report.render_markdown's).
_ROW = re.compile(
    r"^\| (?P<label>[^|]+?) \| (?P<connections>\d+) \| (?P<rps>[\d,.]+) \| (?P<p50>[\d.]+) \|"
    r" (?P<p90>[\d.]+) \| (?P<p99>[\d.]+) \| (?P<errors>\d+) \| (?P<non_2xx>\d+) \|$",
    re.M,
)


def results_from_markdown(page: str) -> list[TargetResult]:
    """The figures of a benchmarks page's "Throughput and latency" table, by target in
    the table's order (a run's requests as its req/s over one second)."""
    section = page.split("## Throughput and latency", 1)[1].split("\n## ", 1)[0]
    results: dict[str, TargetResult] = {}
    for row in _ROW.finditer(section):
        label = row["label"]
        result = results.setdefault(label, TargetResult(_target(label)))
        connections = int(row["connections"])
        result.runs[connections] = Run(
            connections,
            round(float(row["rps"].replace(",", ""))),
            1.0,
            float(row["p50"]),
            float(row["p90"]),
            float(row["p99"]),
            int(row["errors"]),
            int(row["non_2xx"]),
        )
    return list(results.values())


def _target(label: str) -> Target:
    """The bench's target of a table's label (one measured at another revision: its own
    target's, at that revision)."""
    name, _, revision = label.partition(" @ ")
    known = next((t for t in (*TARGETS, PEER) if t.label == name), None)
    if known is None:  # a row of a page an older bench wrote: drawn by its label
        known = Target(name, _backend_of(name))
    return known.at(revision) if revision else known


def _backend_of(label: str) -> str | None:
    if label.startswith("direct"):
        return None
    return PEER.backend if label.startswith(PEER.label.split(" (")[0]) else "redis"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.chart", description=__doc__)
    parser.add_argument("page", type=Path, help="a page the bench wrote (docs/benchmarks.md)")
    parser.add_argument("--output", type=Path, help="default: the page's name, .png")
    args = parser.parse_args(argv)
    results = results_from_markdown(args.page.read_text())
    _save(figure(results), args.output or args.page.with_suffix(".png"))


if __name__ == "__main__":
    main()
