"""What the benchmark measures and what it found: targets, runs, results, the report."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # real.py and saturation.py start servers: the model only names them
    from loadtest.bench.real import RowResult
    from loadtest.bench.saturation import SaturationResult

# The targets of the issue, checked against the figures (never adjusted to them).
TARGET_RPS = 2000.0  # req/s: Redis, 2 workers, 64 connections, auth + metrics
TARGET_ADDED_MS = 1.0  # added median latency at 1 connection
TARGET_RSS_MB = 100.0  # idle RSS per worker
TARGET_READY_S = 2.0  # start to ready
# Issue #15: against the peer (TensorZero), ours over theirs at 64 connections, and our added
# median at 1 connection, both from the alternated rounds.
TARGET_PEER_RATIO = 0.9
TARGET_PEER_ADDED_MS = 0.25
# Issue #33: on the default config, ours over theirs at least this in *every* round, and
# our added median at 1 connection no more than theirs in every round.
TARGET_PEER_EVERY_ROUND = 1.0
CONNECTIONS = (1, 64)
PAIRS = 3  # 1-connection slices through the proxy, each paired with a direct one


CHAT_PATH = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
PEER_BACKEND = "tensorzero"
# The proxy's configs (loadtest/bench/configs.py): the bench's deployment, far from its
# limits with `burst: 100000` (leases answer almost every request), and the default one,
# `burst` unset (1: exact pacing, a Redis round trip per request), what users run.
LARGE_BURST = "large-burst"
DEFAULT_CONFIG = "default"


@dataclass(frozen=True)
class Target:
    """What wrk is pointed at: the fake upstream itself, a proxy in front of it (the work
    tree's, or with ``baseline`` set, the proxy as of that git revision), or the peer
    gateway (TensorZero), each with its own chat route and model name."""

    label: str
    backend: str | None  # None: direct; "nolimit" (auth, no limits), "memory", "redis", PEER
    workers: int = 1
    baseline: str | None = None
    path: str = CHAT_PATH
    model: str = MODEL
    # A proxy's config (LARGE_BURST or DEFAULT_CONFIG); the peer's: its rule (peer.RULES).
    config: str = LARGE_BURST

    @property
    def peer(self) -> bool:
        """Another gateway, not this proxy: measured alike, but no goal applies to it."""
        return self.backend == PEER_BACKEND

    @property
    def proxy(self) -> bool:
        return self.backend is not None and not self.peer

    @property
    def slug(self) -> str:
        if self.peer:
            return PEER_BACKEND
        name = "direct" if self.backend is None else f"{self.backend}-{self.workers}w"
        if self.config == DEFAULT_CONFIG:
            name += "-default"
        return name if self.baseline is None else f"{name}-baseline"

    def at(self, revision: str) -> Target:
        """The same target measured on the proxy as of ``revision``."""
        return dataclasses.replace(self, label=f"{self.label} @ {revision}", baseline=revision)


# The headline before the real-traffic rows (real.py), now a secondary row named for what
# it is: the default config's rules (Redis, 2 workers, a key with rpm and tpm, a
# deployment with rpm and the default burst), one key and one deployment far from its
# limit. (The name HEADLINE stays for the code that compares it with the peer.)
HEADLINE = Target(
    "proxy, Redis, 2 workers, one key, one deployment at 6,000,000 rpm",
    "redis",
    2,
    config=DEFAULT_CONFIG,
)
TARGETS = (
    Target("direct to the fake upstream", None),
    Target("proxy, no limits, 1 worker", "nolimit", 1),
    Target("proxy, memory, 1 worker, burst 100000", "memory", 1),
    Target("proxy, memory, 2 workers, burst 100000", "memory", 2),
    Target("proxy, Redis, 1 worker, burst 100000", "redis", 1),
    Target("proxy, Redis, 2 workers, burst 100000", "redis", 2),
    HEADLINE,
)
# The peer: TensorZero's Rust gateway (from PyPI) with a Redis rate-limit rule that never
# trips (loadtest/bench/peer.py), compared in turns with each of COMPARED (`--no-peer`
# skips it; `--peer-rule` chooses its rule).
PEER = Target(
    "TensorZero gateway (Rust), Redis rate limit",
    PEER_BACKEND,
    path="/openai/v1/chat/completions",
    model=f"tensorzero::model_name::{MODEL}",
    config="requests+tokens",  # peer.DEFAULT_RULE
)
LARGE_BURST_REDIS = TARGETS[-2]  # proxy, Redis, 2 workers, burst 100000
COMPARED = (HEADLINE, LARGE_BURST_REDIS)  # the one-key config first
# What `make bench` measures of TARGETS besides the real-traffic rows (`--all-rows`: all).
DEFAULT_TARGETS = (TARGETS[0], HEADLINE)


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


# Each round's turns are cut into this many slices, the two sides alternating slice by
# slice: the host's speed moves over seconds (two identical proxies, whole 5 s turns: one
# round's req/s 0.84x to 1.42x apart, its added p50 up to 0.41 ms; in 5 slices: 0.96x to
# 1.06x and 0.10 ms, `python -m loadtest.noise`; docs/performance.md, "The bench's noise
# floor").
SLICES = 5


@dataclass(frozen=True)
class Turn:
    """One version's share of a round of an alternated comparison (alternate.py)."""

    rps: float  # 64 connections
    cpu_us: float  # proxy CPU per request at 64 connections, microseconds
    p50_ms: float  # 1 connection
    # p50 at 1 connection minus a direct slice's right before it (measured in the peer
    # comparison only: the baseline comparison compares the two p50s directly).
    added_ms: float | None = None
    # The shared redis-server's CPU per request during the 64-connection run (the two
    # sides take turns, so it is this side's limiter work); None when not measured.
    redis_us: float | None = None


@dataclass(frozen=True)
class Round:
    before: Turn
    now: Turn


@dataclass
class Alternation:
    """One proxy target, the baseline revision's and the work tree's, over several rounds;
    or (the peer comparison) the peer as ``before`` and our proxy as ``now``."""

    target: Target  # the work tree's
    baseline: str  # the git revision, or the peer's label
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

    def values(self, figure: str, side: str) -> list[float]:
        """Per round, one side's figure (rounds that did not measure it left out)."""
        found = (getattr(getattr(r, side), figure) for r in self.rounds)
        return [v for v in found if v is not None]


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
    # The peer (before) and each of COMPARED (now), alternated, the headline first; or why
    # the peer was not measured.
    peers: list[Alternation] = field(default_factory=list)
    peer_error: str | None = None
    peer_rule: str = PEER.config  # the rule the peer ran with (peer.RULES)
    # The real-traffic rows (the headline) and the saturated one, and their rounds.
    real: list[RowResult] = field(default_factory=list)
    saturation: SaturationResult | None = None
    rounds: int = 0

    def proxies(self) -> list[TargetResult]:
        """This proxy's results (not direct, not the peer): what the goals apply to."""
        return [r for r in self.results if r.target.proxy]

    def direct(self) -> TargetResult | None:
        return next((r for r in self.results if r.target.backend is None), None)

    def find(self, backend: str, workers: int, config: str = LARGE_BURST) -> TargetResult | None:
        found = (
            r for r in self.results if (r.target.backend, r.target.workers) == (backend, workers)
        )
        return next((r for r in found if r.target.config == config), None)

    @property
    def baseline(self) -> str | None:
        """The git revision measured beside the work tree, if any."""
        return self.alternations[0].baseline if self.alternations else None
