"""``llm-proxy showcase``: run the scenario, print its table, draw its timeline."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from proxy.showcase.report import summarize, table
from proxy.showcase.scenario import Scenario, run

__all__ = ["showcase"]


def showcase(scenario: Scenario, png: Path | None) -> int:
    """Print the table of ``scenario`` and, unless ``png`` is None, draw it there."""
    if importlib.util.find_spec("openai") is None:
        print(
            "llm-proxy showcase: its client is the OpenAI SDK, which is not installed;"
            " run `make showcase` (or pip install 'llm-proxy[demo]')",
            file=sys.stderr,
        )
        return 1
    low, high = scenario.latency
    print(
        f"{scenario.calls} concurrent calls by the OpenAI SDK ({scenario.retries} retries),"
        f" at an upstream that takes {scenario.upstream_rps} a second and answers in"
        f" {low:g}-{high:g} s: straight, and through the proxy ...",
        flush=True,
    )
    try:
        sides = asyncio.run(run(scenario))
    except RuntimeError as exc:  # a child that did not start: what it said
        print(f"llm-proxy showcase: {exc}", file=sys.stderr)
        return 1
    print(table([summarize(side) for side in sides]))
    if png is None:
        return 0
    if importlib.util.find_spec("matplotlib") is None:
        print("no timeline: matplotlib is not installed (`make showcase` installs it)")
        return 0
    from proxy.showcase.chart import draw

    draw(sides, png)
    print(f"timeline: {png}")
    return 0
