"""`python -m loadtest.bench`: see the package's docstring."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from loadtest.bench import __doc__ as DESCRIPTION
from loadtest.bench import peer as peer_config
from loadtest.bench import plan, real, saturation
from loadtest.bench.alternate import alternate, compare_with_peer
from loadtest.bench.chart import write_chart
from loadtest.bench.machine import ForeignLoad, environment
from loadtest.bench.model import (
    COMPARED,
    DEFAULT_TARGETS,
    PEER,
    TARGETS,
    Alternation,
    BenchReport,
)
from loadtest.bench.report import (
    fmt,
    keep_addenda,
    render_markdown,
    render_peer_summary,
    render_table,
    verdicts,
)
from loadtest.bench.report_real import WITHOUT, render_real_summary, saturation_seconds
from loadtest.bench.servers import PeerUnavailable, bench_target, checkout, servers
from loadtest.topology import REPO
from proxy.config.fast_paths import ENV as FAST_PATHS_ENV
from proxy.config.fast_paths import FAST_PATHS

DEFAULT_OUTPUT = REPO / "docs" / "benchmarks.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=DESCRIPTION)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown report")
    parser.add_argument("--no-chart", action="store_true", help="no PNG")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="rows by slug: real, real-latency, 100k-keys, saturated (the real traffic);"
        " direct, redis-2w-default, tensorzero (the peer), and with --all-rows memory-1w, ...",
    )
    parser.add_argument(
        "--all-rows",
        action="store_true",
        help="also the one-key rows of the in-memory limiter, of 1 worker, of no limits and"
        " of the large-burst config (and the peer beside the latter): about 6 more minutes",
    )
    parser.add_argument(
        "--peer-rule",
        choices=sorted(peer_config.RULES),
        default=peer_config.DEFAULT_RULE,
        help="what the peer's one rate-limit rule limits (default: %(default)s, as our key)",
    )
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="skip the peer gateway (TensorZero) and its alternated comparison",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also compare every proxy target with itself as of this git revision",
    )
    parser.add_argument(
        "--without",
        metavar="FAST_PATH",
        choices=sorted(FAST_PATHS),
        help="compare the real-traffic rows with the same code without this fast path"
        " (LLM_PROXY_WITHOUT; docs/performance.md), in turns, as --baseline does",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of the real-traffic rows and of the alternated comparisons",
    )
    args = parser.parse_args(argv)
    if args.without and args.baseline:
        parser.error("--without and --baseline each name the other side: give one")
    without_env = {FAST_PATHS_ENV: args.without} if args.without else None
    if args.without:  # the work tree's code as the other side, that fast path off
        args.baseline = f"{WITHOUT}{args.without}"
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            print(f"{tool} is needed (apt-get install -y {tool})", file=sys.stderr)
            return 2
    peer_target = dataclasses.replace(PEER, config=args.peer_rule)
    rows = TARGETS if args.all_rows else DEFAULT_TARGETS
    candidates = rows if args.no_peer else (*rows, peer_target)
    targets = [t for t in candidates if not args.only or t.slug in args.only]
    real_rows = [row for row in real.ROWS if not args.only or row.slug in args.only]
    saturated = not args.only or "saturated" in args.only
    command = shlex.join(["python", "-m", "loadtest.bench", *sys.argv[1:]])
    if os.environ.get("BENCH_COMMAND"):  # `make bench` names itself
        command = os.environ["BENCH_COMMAND"]
    compared = [t for t in COMPARED if t in targets] if peer_target in targets else []
    steps = [
        *plan.real_steps(real_rows, args.rounds, args.duration, args.warmup, bool(args.baseline)),
        *(plan.saturation_steps(args.rounds, args.duration) if saturated else []),
        *plan.target_steps(targets, args.duration, args.warmup),
        *plan.compare_steps(
            len(compared),
            len([t for t in targets if t.proxy]) if args.baseline and not args.without else 0,
            args.rounds,
            args.duration,
        ),
    ]
    print("plan:")
    for line in plan.render(steps):
        print(line)
    started = time.monotonic()
    machine = environment()  # before the runs: the commit is the code that was measured
    results = []
    alternations: list[Alternation] = []
    peers: list[Alternation] = []
    peer_error: str | None = None
    real_results: list[real.RowResult] = []
    saturation_result: saturation.SaturationResult | None = None
    with contextlib.ExitStack() as stack:
        foreign = stack.enter_context(ForeignLoad())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmproxy-bench-"))
        procs, upstream_url, redis_url = stack.enter_context(servers(Path(tmp)))
        sources = {}
        if args.without:
            sources[args.baseline] = REPO
        elif args.baseline:
            sources[args.baseline] = stack.enter_context(checkout(args.baseline))
        running: real.Stack | None = None
        for row in real_rows:  # the headline first
            if running is None or running.shape != row.shape:
                if running is not None:
                    real.stop_stack(procs, running)
                running = real.start_stack(
                    procs, row.shape, upstream_url, redis_url, sources.get(args.baseline or ""),
                    print, without_env,
                )  # fmt: skip
            real_results.append(
                real.run_row(
                    row,
                    running,
                    procs,
                    upstream_url,
                    args.rounds,
                    args.duration,
                    args.warmup,
                    print,
                    args.baseline,
                )
            )
        if running is not None:
            real.stop_stack(procs, running)
            real.restore_upstream(upstream_url)
        if saturated:
            saturation_result = saturation.run_saturation(
                procs, redis_url, args.rounds, saturation_seconds(args.duration), print
            )
        for target in targets:
            try:
                results.append(
                    bench_target(
                        target, procs, upstream_url, redis_url, args.duration, args.warmup, print
                    )
                )
            except PeerUnavailable as exc:  # the rest of the bench goes on without it
                peer_error = str(exc).splitlines()[0]
                print(f"{target.label}: not measured, {exc}", file=sys.stderr)
        # The peer beside each compared config of ours that was measured (--only), the
        # one-key config first.
        for ours in compared if peer_error is None else []:
            print(f"{PEER.label} and {ours.label}, in turns")
            try:
                compared_once = compare_with_peer(
                    ours, peer_target, procs, upstream_url, redis_url, args.rounds,
                    args.duration / 2, print,
                )  # fmt: skip
                peers.append(compared_once)
            except PeerUnavailable as exc:
                peer_error = str(exc).splitlines()[0]
                print(f"{PEER.label}: not compared, {exc}", file=sys.stderr)
                break
        if args.baseline and not args.without:  # (--without: the real-traffic rows only)
            for target in targets:
                if not target.proxy:
                    continue
                print(f"{target.label}: {args.baseline} and now, in turns")
                alternations.append(
                    alternate(
                        target,
                        args.baseline,
                        procs,
                        upstream_url,
                        redis_url,
                        sources,
                        args.rounds,
                        args.duration / 2,
                        print,
                    )
                )
    machine.foreign_cores = foreign.cores
    report = BenchReport(
        results,
        machine,
        command,
        args.duration,
        alternations=alternations,
        peers=peers,
        peer_error=peer_error,
        peer_rule=args.peer_rule,
        real=real_results,
        saturation=saturation_result,
        rounds=args.rounds,
    )
    if not args.no_chart and results:
        chart = args.output.with_name(args.output.stem + ".png")
        write_chart(report, chart)
        report.chart = chart.name
    print()
    if results:
        print(render_table(report))
        print()
    for v in verdicts(report) if results else []:
        met = "n/a" if v.met is None else ("met" if v.met else "NOT met")
        print(f"{v.name}: {v.measured} (target {v.target}): {met}")
    for line in render_real_summary(report.real, report.saturation):
        print(line)
    for line in render_peer_summary(report):
        print(line)
    print(f"CPU used by other processes during the run: {fmt(foreign.cores, '.2f')} cores")
    previous = args.output.read_text() if args.output.exists() else ""
    args.output.write_text(keep_addenda(previous, render_markdown(report)))
    print(f"\nwrote {args.output} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
