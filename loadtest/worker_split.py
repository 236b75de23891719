"""How ``serve --workers 2`` shares a load generator's connections, round by round.

    python -m loadtest.worker_split                     # this tree
    python -m loadtest.worker_split --baseline REV      # and a revision, in turns

The bench's headline target (Redis, 2 workers, the default config) in front of the fake
upstream; each round, wrk opens 64 connections at once and keeps them for its run, and
the connections each worker holds are read from /proc halfway through. A split far from
even puts most of the load on one worker's core: the round's req/s and the proxy's CPU
per request are printed beside it, for what they are worth on a shared machine (on the
bench's 2-core host, one worker holding every connection forwarded as much as two).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from loadtest.bench.model import HEADLINE
from loadtest.bench.servers import (
    connections_by_worker,
    cpu_seconds,
    servers,
    start_proxy,
    trees,
)
from loadtest.bench.wrk import run_wrk

CONNECTIONS = 64


def split_during(pid: int, port: int, after: float) -> tuple[threading.Thread, list[int]]:
    """A started thread that reads each worker's connections once ``after`` seconds have
    passed, into the returned list (sorted, fewest first)."""
    held: list[int] = []

    def read() -> None:
        time.sleep(after)
        held.extend(sorted(connections_by_worker(pid, port).values()))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.worker_split", description=__doc__)
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round")
    args = parser.parse_args(argv)
    with (
        trees(args.baseline) as measured,
        tempfile.TemporaryDirectory() as tmp,
        servers(Path(tmp)) as (procs, upstream, redis_url),
    ):
        proxies = {}
        for index, (name, tree) in enumerate(measured.items()):
            process, url, _ = start_proxy(
                HEADLINE, procs, upstream, redis_url, sources={"": tree}, name=f"proxy{index}"
            )
            run_wrk(url, CONNECTIONS, 2.0)  # warm-up
            proxies[name] = (process, url)
        for round_ in range(1, args.rounds + 1):
            for name, (process, url) in proxies.items():
                port = urllib.parse.urlsplit(url).port or 80
                thread, held = split_during(process.pid, port, args.duration / 2)
                cpu = cpu_seconds(process.pid)
                run = run_wrk(url, CONNECTIONS, args.duration)
                thread.join()
                cpu_us = (cpu_seconds(process.pid) - cpu) / max(run.requests, 1) * 1e6
                print(
                    f"round {round_}, {name}: connections per worker {held},"
                    f" {run.rps:,.0f} req/s, proxy CPU {cpu_us:.0f} us per request,"
                    f" p50 {run.p50_ms:.2f} ms",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
