"""The showcase's timeline as a PNG: one row per call, one bar per HTTP request it sent.

matplotlib is imported here only (``make showcase`` installs it; the proxy does not
need it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.showcase.report import Side, summarize

__all__ = ["draw"]

ANSWERED = "#2e7d32"  # a 2xx: the call's answer
REFUSED = "#c62828"  # a 429 (or any other failure) from the upstream
WAITING = "#b0bec5"  # waiting in the proxy for the request's turn
FAILED = "#c62828"


def draw(sides: list[Side], path: Path) -> None:
    """Write the timeline of ``sides`` (one panel each, the same time axis) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = max(len(side.calls) for side in sides)
    figure, axes = plt.subplots(
        len(sides), 1, sharex=True, figsize=(9, 1.2 + 0.32 * rows * len(sides)), dpi=80
    )
    for ax, side in zip(axes, sides, strict=True):
        _panel(ax, side)
    axes[-1].set_xlabel("seconds since the first request")
    axes[-1].set_xlim(left=0)
    figure.legend(
        handles=[
            Patch(color=ANSWERED, label="answered (200)"),
            Patch(color=REFUSED, label="refused by the upstream (429)"),
            Patch(color=WAITING, label="waiting in the proxy for its turn"),
        ],
        loc="lower center",
        ncol=3,
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path)
    plt.close(figure)


def _panel(ax: Any, side: Side) -> None:
    summary = summarize(side)
    ax.set_title(
        f"{side.name}: {summary.succeeded}/{summary.calls} succeeded,"
        f" {summary.upstream_429s} upstream 429s, done in {summary.time_to_finish:.1f} s",
        fontsize=10,
        loc="left",
    )
    for row, call in enumerate(side.calls):
        for attempt in call.attempts:
            waited = min(attempt.waited, attempt.end - attempt.start)
            if waited > 0:
                ax.barh(row, waited, left=attempt.start, color=WAITING, height=0.6)
            color = ANSWERED if 200 <= attempt.status < 300 else REFUSED
            width = max(attempt.end - attempt.start - waited, 0.04)  # an instant 429: visible
            ax.barh(row, width, left=attempt.start + waited, color=color, height=0.6)
        if call.error is not None:
            ax.plot(call.end, row, marker="x", color=FAILED, markersize=9, mew=2)
            ax.annotate(
                "gave up", (call.end, row), xytext=(6, -3), textcoords="offset points", fontsize=8
            )
    ax.set_yticks(range(len(side.calls)), [f"call {i + 1}" for i in range(len(side.calls))])
    ax.set_ylim(len(side.calls) - 0.5, -0.5)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
