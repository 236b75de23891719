"""What the benchmark measures and what it found: targets, runs, results, the report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# The targets of the issue, checked against the figures (never adjusted to them).
TARGET_RPS = 2000.0  # req/s: Redis, 2 workers, 64 connections, auth + metrics
TARGET_ADDED_MS = 1.0  # added median latency at 1 connection
TARGET_RSS_MB = 100.0  # idle RSS per worker
TARGET_READY_S = 2.0  # start to ready
CONNECTIONS = (1, 64)
PAIRS = 3  # 1-connection slices through the proxy, each paired with a direct one


@dataclass(frozen=True)
class Target:
    """What wrk is pointed at: the fake upstream itself, or a proxy in front of it (the
    work tree's, or with ``baseline`` set, the proxy as of that git revision)."""

    label: str
    backend: str | None  # None: direct; "nolimit" (auth, no limits), "memory" or "redis"
    workers: int = 1
    baseline: str | None = None

    @property
    def slug(self) -> str:
        name = "direct" if self.backend is None else f"{self.backend}-{self.workers}w"
        return name if self.baseline is None else f"{name}-baseline"

    def at(self, revision: str) -> Target:
        """The same target measured on the proxy as of ``revision``."""
        return Target(f"{self.label} @ {revision}", self.backend, self.workers, revision)


TARGETS = (
    Target("direct to the fake upstream", None),
    Target("proxy, no limits, 1 worker", "nolimit", 1),
    Target("proxy, memory, 1 worker", "memory", 1),
    Target("proxy, memory, 2 workers", "memory", 2),
    Target("proxy, Redis, 1 worker", "redis", 1),
    Target("proxy, Redis, 2 workers", "redis", 2),
)


@dataclass(frozen=True)
class Run:
    """One wrk run's figures."""

    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # socket errors and timeouts
    non_2xx: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


@dataclass
class TargetResult:
    target: Target
    runs: dict[int, Run] = field(default_factory=dict)  # by connections
    ready_s: float | None = None  # proxy only
    worker_rss_mb: list[float] = field(default_factory=list)  # proxy only, idle
    supervisor_rss_mb: float | None = None  # with --workers > 1: uvicorn's parent
    # Added median latency at 1 connection, from slices alternating with the direct run
    # (PAIRS): the median of each pair's difference, so the machine's drift cancels out.
    added_ms: float | None = None


@dataclass(frozen=True)
class Turn:
    """One version's share of a round of an alternated comparison (alternate.py)."""

    rps: float  # 64 connections
    cpu_us: float  # proxy CPU per request at 64 connections, microseconds
    p50_ms: float  # 1 connection


@dataclass(frozen=True)
class Round:
    before: Turn
    now: Turn


@dataclass
class Alternation:
    """One proxy target, the baseline revision's and the work tree's, over several rounds."""

    target: Target  # the work tree's
    baseline: str
    rounds: list[Round] = field(default_factory=list)

    def ratios(self, figure: str) -> list[float]:
        """Per round, now over before (``figure``: a field of ``Turn``)."""
        return [
            getattr(r.now, figure) / getattr(r.before, figure)
            for r in self.rounds
            if getattr(r.before, figure)
        ]

    def differences(self, figure: str) -> list[float]:
        """Per round, now minus before."""
        return [getattr(r.now, figure) - getattr(r.before, figure) for r in self.rounds]

    def median(self, figure: str, side: str) -> float:
        """The median over the rounds of one side's (``before`` or ``now``) figure."""
        return statistics.median(getattr(getattr(r, side), figure) for r in self.rounds)


@dataclass
class Environment:
    cpu: str
    cores: int
    memory_gb: float
    system: str
    python: str
    packages: dict[str, str]
    tools: dict[str, str]
    commit: str
    # CPU used by processes the bench did not start, in cores, averaged over the run: the
    # machine may be shared, and other work running alongside lowers every figure.
    foreign_cores: float | None = None


@dataclass
class BenchReport:
    results: list[TargetResult]
    environment: Environment
    command: str
    duration: float
    chart: str | None = None  # file name of the PNG, next to the Markdown
    # With a baseline revision: each proxy target, before and after, alternated.
    alternations: list[Alternation] = field(default_factory=list)

    def direct(self) -> TargetResult | None:
        return next((r for r in self.results if r.target.backend is None), None)

    def find(self, backend: str, workers: int) -> TargetResult | None:
        return next(
            (r for r in self.results if (r.target.backend, r.target.workers) == (backend, workers)),
            None,
        )

    @property
    def baseline(self) -> str | None:
        """The git revision measured beside the work tree, if any."""
        return self.alternations[0].baseline if self.alternations else None
