"""What a run of the bench will do and how long it should take, printed before it starts
(`make bench` must finish within 15 minutes on a 2-core machine). *pure*

Estimates from the slices' lengths plus what starting the servers took on the 2-core
machine (seconds): a replica of 1,000 keys about 1.2 to ready and 1 more to settle, one
of 100,000 keys about 5 (its config written in 3 more), the peer about 1; every wrk run
about 0.3 more than its length.
"""

from __future__ import annotations

from loadtest.bench import saturation
from loadtest.bench.model import PAIRS, Target
from loadtest.bench.real import REPLICAS, Row, row_plan, slice_seconds
from loadtest.bench.report_real import saturation_seconds

WRK_OVERHEAD = 0.3
REPLICA_START = {1_000: 2.5, 100_000: 7.0}  # keys: seconds to ready and settled
CONFIG_WRITE = {100_000: 3.0}
SERVER_START = 3.0  # a proxy of the one-key rows, or the peer


def real_steps(
    rows: list[Row], rounds: int, duration: float, warmup: float, baseline: bool
) -> list[tuple[str, float]]:
    steps: list[tuple[str, float]] = []
    shape = None
    sides = 2 if baseline else 1
    for row in rows:
        if row.shape != shape:
            shape = row.shape
            start = REPLICA_START.get(shape.keys, 2.5) * REPLICAS + CONFIG_WRITE.get(shape.keys, 0)
            steps.append((f"start {REPLICAS} replicas, {shape.keys:,} keys", start * sides))
        seconds = slice_seconds(duration)
        per_round = sum(seconds[c] + WRK_OVERHEAD for _, c in row_plan(row, baseline))
        steps.append((f"{row.slug}: {rounds} rounds", rounds * per_round + sides * warmup))
    return steps


def saturation_steps(rounds: int, duration: float) -> list[tuple[str, float]]:
    start = saturation.DEPLOYMENTS * 1.0 + REPLICA_START[1_000] * saturation.REPLICAS
    per_round = saturation_seconds(duration) + 1.0 + WRK_OVERHEAD
    return [("saturated: start", start), (f"saturated: {rounds} rounds", rounds * per_round)]


def target_steps(targets: list[Target], duration: float, warmup: float) -> list[tuple[str, float]]:
    """Each of the one-key rows: warm-up, 1 connection (paired with direct slices for a
    proxy or the peer), 64 connections."""
    steps = []
    for target in targets:
        single = duration * (2 if target.backend is not None else 1)
        start = SERVER_START if target.backend is not None else 0.0
        overhead = WRK_OVERHEAD * (2 * PAIRS + 2)
        steps.append((target.label, start + warmup + single + duration + overhead))
    return steps


def compare_steps(
    compared: int, baseline_targets: int, rounds: int, duration: float
) -> list[tuple[str, float]]:
    """The peer beside each compared config, and the baseline beside each one-key proxy
    row, in turns (alternate.py: per round, the duration at 64 connections and at 1 in
    all, with direct slices beside the peer's; warm-ups of 2 s)."""
    steps = []
    if compared:
        per = 2 * SERVER_START + 4.0 + rounds * (duration + 20 * WRK_OVERHEAD)
        steps.append((f"the peer beside {compared} config(s), in turns", compared * per))
    if baseline_targets:
        per = 2 * SERVER_START + 4.0 + rounds * (0.75 * duration + 20 * WRK_OVERHEAD)
        steps.append(
            (f"the baseline beside {baseline_targets} one-key row(s)", baseline_targets * per)
        )
    return steps


def render(steps: list[tuple[str, float]]) -> list[str]:
    lines = [f"  {label}: about {seconds:.0f} s" for label, seconds in steps]
    total = sum(seconds for _, seconds in steps)
    lines.append(f"  in all: about {total:.0f} s ({total / 60:.1f} minutes)")
    return lines
