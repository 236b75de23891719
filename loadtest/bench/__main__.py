"""`python -m loadtest.bench`: see the package's docstring."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from loadtest.bench import __doc__ as DESCRIPTION
from loadtest.bench.chart import write_chart
from loadtest.bench.machine import ForeignLoad, environment
from loadtest.bench.model import TARGETS, BenchReport, Target
from loadtest.bench.report import fmt, render_markdown, render_table, verdicts
from loadtest.bench.servers import bench_target, checkout, servers
from loadtest.topology import REPO

DEFAULT_OUTPUT = REPO / "docs" / "benchmarks.md"


def _with_baseline(target: Target, baseline: str | None) -> Iterator[Target]:
    if baseline and target.backend is not None:
        yield target.at(baseline)
    yield target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=DESCRIPTION)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown report")
    parser.add_argument("--no-chart", action="store_true", help="no PNG")
    parser.add_argument(
        "--only", action="append", default=[], help="target slugs (direct, memory-1w, ...)"
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure every proxy target as of this git revision, side by side",
    )
    args = parser.parse_args(argv)
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            print(f"{tool} is needed (apt-get install -y {tool})", file=sys.stderr)
            return 2
    targets = [t for t in TARGETS if not args.only or t.slug in args.only]
    command = shlex.join(["python", "-m", "loadtest.bench", *sys.argv[1:]])
    if os.environ.get("BENCH_COMMAND"):  # `make bench` names itself
        command = os.environ["BENCH_COMMAND"]
    started = time.monotonic()
    machine = environment()  # before the runs: the commit is the code that was measured
    results = []
    with contextlib.ExitStack() as stack:
        foreign = stack.enter_context(ForeignLoad())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmproxy-bench-"))
        procs, upstream_url, redis_url = stack.enter_context(servers(Path(tmp)))
        sources = {}
        if args.baseline:
            sources[args.baseline] = stack.enter_context(checkout(args.baseline))
        for target in targets:
            # The baseline right before the work tree: both see the same machine state.
            for measured in _with_baseline(target, args.baseline):
                result = bench_target(
                    measured,
                    procs,
                    upstream_url,
                    redis_url,
                    args.duration,
                    args.warmup,
                    print,
                    sources,
                )
                results.append(result)
    machine.foreign_cores = foreign.cores
    report = BenchReport(results, machine, command, args.duration)
    if not args.no_chart:
        chart = args.output.with_name(args.output.stem + ".png")
        write_chart(report, chart)
        report.chart = chart.name
    print()
    print(render_table(report))
    print()
    for v in verdicts(report):
        met = "n/a" if v.met is None else ("met" if v.met else "NOT met")
        print(f"{v.name}: {v.measured} (target {v.target}): {met}")
    print(f"CPU used by other processes during the run: {fmt(foreign.cores, '.2f')} cores")
    args.output.write_text(render_markdown(report))
    print(f"\nwrote {args.output} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
