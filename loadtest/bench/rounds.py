"""Rounds of real traffic: several sides (the proxy's replicas, the fake upstream
directly, a baseline revision's replicas) measured slice by slice in each round, the
order of the slices reversed every other round so that the machine's drift falls on
every side alike. Each slice reads, besides wrk's figures, the CPU time the side's
processes and the shared redis-server spent during it (``/proc``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.bench.model import Run
from loadtest.bench.servers import cpu_seconds
from loadtest.bench.wrk import run_traffic


@dataclass(frozen=True)
class Side:
    """What one slice's wrk is pointed at: ``url`` (its first replica: the others are
    reached through ``env``'s ports, one wrk thread each), the processes whose CPU it
    costs, and what bench_traffic.lua is told."""

    name: str
    url: str
    env: dict[str, str]
    pids: tuple[int, ...] = ()
    threads: int = 1


@dataclass(frozen=True)
class Sample:
    """One slice: wrk's figures, and the CPU seconds of the side and of Redis during it."""

    run: Run
    cpu_s: float = 0.0
    redis_cpu_s: float = 0.0

    @property
    def cpu_us(self) -> float:
        """The side's CPU per request, microseconds (0 for a side without processes)."""
        return self.cpu_s / self.run.requests * 1e6 if self.run.requests else 0.0

    @property
    def redis_us(self) -> float:
        return self.redis_cpu_s / self.run.requests * 1e6 if self.run.requests else 0.0


Slot = tuple[str, int]  # (side name, connections)


@dataclass
class Rounds:
    """Each round's samples by (side, connections)."""

    rounds: list[dict[Slot, Sample]] = field(default_factory=list)

    def values(self, side: str, connections: int, figure: Callable[[Sample], float]) -> list[float]:
        return [figure(r[(side, connections)]) for r in self.rounds if (side, connections) in r]

    def differences(
        self, side: str, other: str, connections: int, figure: Callable[[Sample], float]
    ) -> list[float]:
        """Per round, ``side``'s figure minus ``other``'s (rounds that measured both)."""
        return [
            figure(r[(side, connections)]) - figure(r[(other, connections)])
            for r in self.rounds
            if (side, connections) in r and (other, connections) in r
        ]

    def ratios(
        self, side: str, other: str, connections: int, figure: Callable[[Sample], float]
    ) -> list[float]:
        """Per round, ``side``'s figure over ``other``'s."""
        return [
            figure(r[(side, connections)]) / figure(r[(other, connections)])
            for r in self.rounds
            if (side, connections) in r and (other, connections) in r
            and figure(r[(other, connections)])
        ]  # fmt: skip


def plan_order(plan: list[Slot], round_index: int) -> list[Slot]:
    """The slices of round ``round_index``: as planned, reversed in odd rounds."""
    return list(plan) if round_index % 2 == 0 else list(reversed(plan))


def measure(
    sides: dict[str, Side],
    plan: list[Slot],
    rounds: int,
    seconds: dict[int, float],
    log: Callable[[str], None],
    redis_pid: int | None = None,
    name: str = "",
) -> Rounds:
    """``rounds`` rounds of the ``plan``'s slices, each ``seconds[connections]`` long."""
    found = Rounds()
    for i in range(rounds):
        samples: dict[Slot, Sample] = {}
        for side_name, connections in plan_order(plan, i):
            side = sides[side_name]
            cpu = sum(cpu_seconds(pid) for pid in side.pids)
            redis_cpu = cpu_seconds(redis_pid) if redis_pid else 0.0
            # A thread per replica, but one connection is one thread (the first replica).
            threads = min(side.threads, connections)
            run, _ = run_traffic(side.url, connections, seconds[connections], side.env, threads)
            samples[(side_name, connections)] = Sample(
                run,
                sum(cpu_seconds(pid) for pid in side.pids) - cpu,
                cpu_seconds(redis_pid) - redis_cpu if redis_pid else 0.0,
            )
        found.rounds.append(samples)
        log(
            f"  {name} round {i + 1}: "
            + ", ".join(
                f"{s}@{c} {x.run.rps:,.0f} req/s p50 {x.run.p50_ms:.2f} p99 {x.run.p99_ms:.2f} ms"
                + (f" {x.cpu_us:.0f} us CPU" if x.cpu_s else "")
                + (f" non-2xx {x.run.non_2xx}" if x.run.non_2xx else "")
                for (s, c), x in samples.items()
            )
        )
    return found
