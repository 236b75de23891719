"""Python calls per request of a real worker, function by function (cProfile).

    python -m loadtest.calls --mode memory --baseline 4340b93   # this tree against REV

``llm-proxy serve --workers 1`` runs under cProfile in front of the fake upstream (and a
private Redis), and one keep-alive client sends the bench's chat request one at a time;
two runs of different lengths are subtracted, so start-up and shutdown cancel out and
what is left is what one more request costs, in calls per function. Call counts are
exact where timings are not (the profiler slows a call, not the count), and two trees'
counts side by side say where a change added work: this is how the seams' cost was
found (docs/performance.md, "Issue 28's cost, located and trimmed"). ``loadtest.cost``
counts instructions, which say how much; this says where.
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.cost import MODES, Client, bench_requests, served_config, wait_live

_SHORT, _LONG = 300, 1300  # requests of the two subtracted runs

Calls = dict[str, float]  # "module:function" -> calls per request


def _profiled_run(source: Path, mode: str, requests: int) -> collections.Counter[str]:
    """Calls per function over a run of ``requests`` of one worker of ``source``."""
    from loadtest.bench.servers import servers
    from loadtest.bench.wrk import API_KEY
    from loadtest.topology import LOOPBACK, free_port

    with tempfile.TemporaryDirectory() as tmp, servers(Path(tmp)) as (procs, upstream, redis):
        path = served_config(tmp, upstream, redis, mode)
        port, stats = free_port(), Path(tmp) / "calls.prof"
        serve = ["serve", "--config", path, "--host", LOOPBACK, "--port", str(port)]
        code = (
            "import cProfile\nfrom proxy.process.cli import main\n"
            "profile = cProfile.Profile()\nprofile.enable()\n"
            f"try:\n    main({[*serve, '--workers', '1']!r})\n"
            f"finally:\n    profile.disable()\n    profile.dump_stats({str(stats)!r})\n"
        )
        proxy = procs.start("proxy", [sys.executable, "-c", code], source)
        wait_live(proxy, port, lambda: procs.log("proxy"))
        with Client(port, bench_requests(API_KEY)) as client:
            client.send(requests)
        proxy.send_signal(signal.SIGINT)  # uvicorn's graceful stop: the profile is written
        try:
            proxy.wait(timeout=30)
        except subprocess.TimeoutExpired:  # (an old revision's stop may hang: forced)
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=30)
        counted: collections.Counter[str] = collections.Counter()
        for (file, _, function), row in pstats.Stats(str(stats)).stats.items():
            counted[f"{_module(file, source)}:{function}"] += row[1]
        return counted


def _module(file: str, source: Path) -> str:
    """A function's file as a module-like name, the same in every tree."""
    if file.startswith(str(source)):
        return os.path.relpath(file, source)
    return file.split("site-packages/")[-1]


def calls_per_request(source: Path, mode: str, runs: tuple[int, int] = (_SHORT, _LONG)) -> Calls:
    """Calls per request by function: the difference of two runs of ``runs`` requests."""
    short, long = (_profiled_run(source, mode, n) for n in runs)
    per = {k: (long[k] - short[k]) / (runs[1] - runs[0]) for k in set(short) | set(long)}
    return {k: v for k, v in per.items() if abs(v) >= 0.05}


def _report(now: Calls, before: Calls | None, label: str, top: int) -> None:
    print(f"  now: {sum(now.values()):,.0f} calls per request", flush=True)
    if before is None:
        for name, n in sorted(now.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {n:7.1f}  {name}")
        return
    print(f"  {label}: {sum(before.values()):,.0f} calls per request")
    changed = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in set(now) | set(before)}
    for name, delta in sorted(changed.items(), key=lambda kv: -abs(kv[1]))[:top]:
        if abs(delta) >= 0.5:
            print(f"    {delta:+7.1f}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.calls", description=__doc__)
    parser.add_argument("--baseline", metavar="REV", help="also count this git revision")
    parser.add_argument("--mode", choices=MODES, action="append", help="default: memory")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    args = parser.parse_args(argv)
    from loadtest.bench.servers import trees

    with trees(args.baseline) as measured:
        for mode in args.mode or ["memory"]:
            print(f"{mode}:", flush=True)
            now = calls_per_request(measured["now"], mode)
            before = None if not args.baseline else calls_per_request(measured[args.baseline], mode)
            _report(now, before, args.baseline or "", args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
