"""The bench's own noise floor: two identical proxies compared as the peer is.

    python -m loadtest.noise                    # 8 rounds, make bench's --duration (10)
    python -m loadtest.noise --rounds 6 --duration 5

Issue 33 asks for ours over the peer's req/s >= 1.0x and our added p50 at one connection
at most the peer's, *in every round* of `make bench`'s comparison. What a round's
difference is worth depends on how far two runs of the *same* server differ on this
machine. This runs two proxies of this tree, identical (the headline: Redis, 2 workers,
the default config; each on its own Redis database), through the very rounds the peer
comparison runs (``alternate.in_turns``: 64 connections, then one connection right after
a direct slice, in alternating slices), and prints each round's ratio of req/s and
difference of added p50. With no true difference, a target "in every round" holds only
with a margin as wide as their range (docs/performance.md, "The bench's noise floor":
0.84x-1.42x and 0.41 ms with one run a side per round, 0.96x-1.06x and 0.10 ms in 5
slices).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.model import HEADLINE, Round

DATABASE_B = 1  # the second proxy's Redis database: neither sees the other's buckets


@dataclass(frozen=True)
class Spread:
    """Round by round, the second proxy against the first: req/s ratio, added p50 (ms)."""

    ratios: list[float]
    added_ms: list[float]

    def lines(self) -> list[str]:
        ratio_median = statistics.median(self.ratios)
        added_median = statistics.median(self.added_ms)
        return [
            "req/s at 64 connections, B / A: "
            + ", ".join(f"{r:.2f}x" for r in self.ratios)
            + f"; median {ratio_median:.2f}x, range {min(self.ratios):.2f}x"
            f" to {max(self.ratios):.2f}x",
            "added p50 at 1 connection, B less A: "
            + ", ".join(f"{d:+.2f}" for d in self.added_ms)
            + f" ms; median {added_median:+.2f}, range {min(self.added_ms):+.2f}"
            f" to {max(self.added_ms):+.2f} ms",
        ]


def spread(rounds: Sequence[Round]) -> Spread:
    """Each round's ``now`` (B) against its ``before`` (A)."""
    ratios = [r.now.rps / r.before.rps for r in rounds if r.before.rps > 0]
    added = [
        r.now.added_ms - r.before.added_ms
        for r in rounds
        if r.now.added_ms is not None and r.before.added_ms is not None
    ]
    if not ratios or not added:
        raise ValueError("no round measured both proxies")
    return Spread(ratios, added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.noise", description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="as make bench's --duration: a turn runs half of it at 64 connections, a quarter at 1",
    )
    args = parser.parse_args(argv)
    from loadtest.bench.alternate import in_turns
    from loadtest.bench.servers import servers, start_proxy

    with tempfile.TemporaryDirectory() as tmp, servers(Path(tmp)) as (procs, upstream, redis):
        second_redis = f"{redis.rsplit('/', 1)[0]}/{DATABASE_B}"
        a, a_url, _ = start_proxy(HEADLINE, procs, upstream, redis, name="noise-a")
        b, b_url, _ = start_proxy(HEADLINE, procs, upstream, second_redis, name="noise-b")
        rounds = in_turns(
            [(HEADLINE, a, a_url), (HEADLINE, b, b_url)],
            args.rounds,
            args.duration / 2,
            print,
            "  A vs B",
            direct_url=upstream,
        )
    print(f"two identical proxies ({HEADLINE.label}), {args.rounds} rounds in turns:")
    for line in spread(rounds).lines():
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
