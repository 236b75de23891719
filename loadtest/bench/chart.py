"""The chart beside docs/benchmarks.md (matplotlib, installed by `make bench` only)."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench.model import TARGET_RPS, BenchReport


def write_chart(report: BenchReport, path: Path) -> None:
    """Two bar charts: req/s at 64 connections, p50 at 1 connection, one bar per target."""
    results = list(report.results)
    labels = [r.target.label.replace("direct to the fake upstream", "direct") for r in results]
    rps = [r.runs[64].rps if 64 in r.runs else 0.0 for r in results]
    p50 = [r.runs[1].p50_ms if 1 in r.runs else 0.0 for r in results]
    import matplotlib

    matplotlib.use("Agg")  # no display: draw to a file
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    short = [
        label.replace("proxy, ", "").replace(" gateway (Rust)", "").replace(", ", "\n")
        for label in labels
    ]
    # Grey: direct; orange: the peer gateway; blue: this proxy.
    colors = [
        "#888888" if r.target.backend is None else "#dd8452" if r.target.peer else "#3b75af"
        for r in results
    ]
    left.bar(short, rps, color=colors)
    left.set_title("requests/s at 64 connections")
    left.axhline(TARGET_RPS, color="#c44e52", linestyle="--", linewidth=1)
    left.text(len(short) - 0.5, TARGET_RPS, f" target {TARGET_RPS:,.0f}", va="bottom", ha="right")
    right.bar(short, p50, color=colors)
    right.set_title("median latency (ms) at 1 connection")
    for axis, values, spec in ((left, rps, ",.0f"), (right, p50, ".2f")):
        for i, value in enumerate(values):
            axis.text(i, value, f"{value:{spec}}", ha="center", va="bottom", fontsize=8)
        axis.tick_params(axis="x", labelsize=8)
    fig.suptitle("llm-proxy: non-streamed chat completions via wrk (direct vs. through the proxy)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
