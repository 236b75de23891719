"""Redis calls per request of the proxy in the default config: robust where req/s is not.

    python -m loadtest.redis_calls                     # this tree
    python -m loadtest.redis_calls --baseline main     # and a revision, in turns

The bench's headline target (Redis, 2 workers, the default config: a deployment paced
with ``burst: 1``) in front of the fake upstream, loaded by wrk at each connection count;
Redis's ``INFO commandstats`` before and after give the scripts and functions it ran
(``fcall``, ``evalsha``, ``eval``: one per operation, however batched), divided by the
requests wrk saw answered. The count does not depend on how busy the machine is, only on
how requests fall into leases; the proxy's CPU per request (its processes' user and
system time), req/s and p50 are printed beside it, for what they are worth on a shared
machine.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import redis

from loadtest.bench.model import HEADLINE
from loadtest.bench.servers import cpu_seconds, servers, start_proxy, trees
from loadtest.bench.wrk import run_wrk

SCRIPT_COMMANDS = ("fcall", "evalsha", "eval")


def script_calls(url: str) -> int:
    """Scripts and functions Redis has run so far."""
    with redis.Redis.from_url(url, decode_responses=True) as c:
        stats = c.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in SCRIPT_COMMANDS)


def measure(source: Path, name: str, connections: list[int], duration: float) -> None:
    with tempfile.TemporaryDirectory() as tmp, servers(Path(tmp)) as (procs, upstream, url):
        process, proxy_url, _ = start_proxy(
            HEADLINE, procs, upstream, url, sources={"": source}, name="proxy"
        )
        try:
            run_wrk(proxy_url, 8, 2.0)  # warm-up
            for c in connections:
                before, cpu = script_calls(url), cpu_seconds(process.pid)
                run = run_wrk(proxy_url, c, duration)
                calls = script_calls(url) - before
                requests = max(run.requests, 1)
                cpu_us = (cpu_seconds(process.pid) - cpu) / requests * 1e6
                print(
                    f"{name}: {c} connections: {calls / requests:.3f} Redis calls per request"
                    f" ({calls:,} for {run.requests:,}), proxy CPU {cpu_us:.0f} us per request,"
                    f" {run.rps:,.0f} req/s, p50 {run.p50_ms:.2f} ms, non-2xx {run.non_2xx}",
                    flush=True,
                )
        finally:
            procs.stop(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.redis_calls", description=__doc__)
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument("--connections", type=int, action="append", help="default: 1 and 64")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    args = parser.parse_args(argv)
    connections = args.connections or [1, 64]
    with trees(args.baseline) as measured:
        for name, tree in measured.items():
            measure(tree, name, connections, args.duration)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
