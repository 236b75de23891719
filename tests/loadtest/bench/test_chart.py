"""The benchmark's chart (docs/benchmarks.png): drawn from a page's figures, and laid out
so that no text sits on another or on a bar."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from loadtest.bench.chart import figure, main, results_from_markdown

pytest.importorskip("matplotlib")

# A page an older bench wrote (its rows named as they were then): the chart draws any.
PAGE = Path(__file__).with_name("older_page.md")


_LABELS = [
    "direct to the fake upstream",
    "proxy, no limits, 1 worker",
    "proxy, memory, 1 worker, burst 100000",
    "proxy, memory, 2 workers, burst 100000",
    "proxy, Redis, 1 worker, burst 100000",
    "proxy, Redis, 2 workers, burst 100000",
    "proxy, Redis, 2 workers, default config (burst 1)",
    "TensorZero gateway (Rust), Redis rate limit",
]


def test_the_pages_figures_are_read_back_by_target() -> None:
    results = results_from_markdown(PAGE.read_text())
    assert [r.target.label for r in results] == _LABELS
    assert results[-1].target.peer and results[0].target.backend is None
    assert all(set(r.runs) == {1, 64} for r in results)
    direct = results[0].runs
    assert direct[64].rps > direct[1].rps > 0 and direct[1].p50_ms > 0


@pytest.mark.slow
def test_no_text_of_the_chart_overlaps_another_or_a_bar() -> None:
    """Long labels side by side overlapped ("Redis workers2 workers"), and the target's
    label sat on a bar: every label, title and figure has its own room."""
    from matplotlib.patches import Rectangle

    fig = figure(results_from_markdown(PAGE.read_text()))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    drawn = [*fig.texts]  # the title; then each panel's title, figures and drawn ticks
    for axis in fig.axes:
        low, high = axis.get_xlim()
        ticks = zip(axis.get_xticks(), axis.get_xticklabels(), strict=True)
        drawn += [axis.title, *axis.texts, *(label for x, label in ticks if low <= x <= high)]
        drawn += [label for label in axis.get_yticklabels() if label.get_visible()]
    texts = [t.get_window_extent(renderer) for t in drawn if t.get_text().strip()]
    assert len(texts) > 3 * len(_LABELS)
    bars = [
        patch.get_window_extent(renderer)
        for axis in fig.axes
        for patch in axis.patches
        if isinstance(patch, Rectangle)
    ]
    assert len(bars) == 2 * len(_LABELS)  # one a target in each panel
    overlapping = [(a, b) for a, b in combinations(texts, 2) if a.overlaps(b)]
    assert overlapping == []
    # A figure begins where its bar ends: touching, not on it (half a pixel).
    on_bars = [t for t in texts for bar in bars if t.x0 < bar.x1 - 0.5 and t.overlaps(bar)]
    assert on_bars == []
    width, height = fig.canvas.get_width_height()
    assert all(t.x0 >= 0 and t.x1 <= width and t.y0 >= 0 and t.y1 <= height for t in texts)


@pytest.mark.slow
def test_the_chart_is_drawn_again_from_a_page(tmp_path: Path) -> None:
    output = tmp_path / "chart.png"
    main([str(PAGE), "--output", str(output)])
    assert output.read_bytes().startswith(b"\x89PNG")
