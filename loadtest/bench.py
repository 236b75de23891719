"""`make bench`: the proxy's throughput, latency and overhead on this machine, with wrk.

    python -m loadtest.bench                         # ~3 minutes; writes docs/benchmarks.md
    python -m loadtest.bench --duration 5 --output /tmp/bench.md

One run measures, at 1 and at 64 connections, non-streamed chat completions:

* directly against the fake upstream (the baseline: no proxy);
* through the proxy with the in-memory limiter, 1 and 2 workers;
* through the proxy with the Redis limiter (its own redis-server), 1 and 2 workers;

always with a client key (auth) and metrics on, and with limits so high they never make a
request wait, so what is measured is the proxy's own cost. At 1 connection the proxy is
measured in slices that alternate with direct ones (``paired_run``): the added latency is
the median of the pairs' differences, robust to the machine speeding up or slowing down.
It also measures each proxy's time from start to a 200 on /health/ready and the resident
memory (RSS) of each worker when idle. It prints a table and writes a Markdown report
with a PNG chart (matplotlib if installed, else a bare bar chart drawn by ``write_png``).

Everything runs on 127.0.0.1, every process is started here and stopped at the end, and
every wrk run is bounded by ``--duration``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loadtest.topology import LOOPBACK, REPO, free_port

LUA_SCRIPT = Path(__file__).with_name("bench_chat.lua")
CHAT_PATH = "/v1/chat/completions"
API_KEY = "sk-bench-client"
CONNECTIONS = (1, 64)
PAIRS = 3  # 1-connection slices through the proxy, each paired with a direct one
DEFAULT_OUTPUT = REPO / "docs" / "benchmarks.md"
PACKAGES = (
    "llm-proxy",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "httpx",
    "httpx-aiohttp",
    "aiohttp",
    "redis",
    "hiredis",
    "prometheus-client",
    "pydantic",
    "orjson",
)

# The targets of the issue, checked against the figures (never adjusted to them).
TARGET_RPS = 2000.0  # req/s: Redis, 2 workers, 64 connections, auth + metrics
TARGET_ADDED_MS = 1.0  # added median latency at 1 connection
TARGET_RSS_MB = 100.0  # idle RSS per worker
TARGET_READY_S = 2.0  # start to ready


@dataclass(frozen=True)
class Target:
    """What wrk is pointed at: the fake upstream itself, or a proxy in front of it."""

    label: str
    backend: str | None  # None: direct; "nolimit" (auth, no limits), "memory" or "redis"
    workers: int = 1

    @property
    def slug(self) -> str:
        return "direct" if self.backend is None else f"{self.backend}-{self.workers}w"


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

    def direct(self) -> TargetResult | None:
        return next((r for r in self.results if r.target.backend is None), None)

    def find(self, backend: str, workers: int) -> TargetResult | None:
        return next(
            (
                r
                for r in self.results
                if r.target.backend == backend and r.target.workers == workers
            ),
            None,
        )


# --- measuring --------------------------------------------------------------------------------


def parse_wrk(output: str, connections: int) -> Run:
    """The JSON line bench_chat.lua prints at the end of a wrk run."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith('{"requests"')), None)
    if line is None:
        raise RuntimeError(f"no figures in wrk's output:\n{output[-2000:]}")
    data = json.loads(line)
    return Run(
        connections=connections,
        requests=int(data["requests"]),
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=sum(
            int(data[k]) for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
        ),
        non_2xx=int(data["non_2xx"]),
    )


def wrk_command(url: str, connections: int, duration: float) -> list[str]:
    return [
        "wrk",
        "-t1",  # one thread: the 2-core machine needs the other cycles for the servers
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout", "10s",
        "-s", str(LUA_SCRIPT),
        url + CHAT_PATH,
    ]  # fmt: skip


def run_wrk(url: str, connections: int, duration: float) -> Run:
    env = {**os.environ, "BENCH_API_KEY": API_KEY}
    done = subprocess.run(
        wrk_command(url, connections, duration),
        capture_output=True,
        text=True,
        env=env,
        timeout=duration + 30,
        check=True,
    )
    return parse_wrk(done.stdout, connections)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Processes:
    """Children started by the bench, each in its own process group; all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                start_new_session=True,
            )
        self.started.append(process)
        _CHILD_SESSIONS.add(process.pid)
        return process

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group
        if process in self.started:
            self.started.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.started)):
            self.stop(process)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def wait_until(check: str, process: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until GET ``check`` answers 200 (polled every 10 ms)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        if http_ok(check):
            return time.perf_counter() - start
        time.sleep(0.01)
    raise RuntimeError(f"{check} not ready within {timeout} s")


def proxy_config(
    upstream_url: str, redis_url: str | None, limits: bool = True
) -> dict[str, object]:
    """Auth on, limits that never bind: what is measured is the proxy's own cost. Without
    ``limits``, no key or deployment limit at all: the proxy's cost without its limiter."""
    if not limits:
        config = proxy_config(upstream_url, None)
        config["keys"] = [{"name": "bench", "key": API_KEY}]
        deployment = config["models"][0]["deployments"][0]  # type: ignore[index]
        del deployment["rpm"], deployment["burst"]
        return config
    return {
        "redis": {"url": redis_url or ""},
        "keys": [{"name": "bench", "key": API_KEY, "rpm": 100_000_000, "tpm": 10_000_000_000}],
        "models": [
            {
                "name": "gpt-4o-mini",
                "deployments": [
                    {
                        "id": "fake",
                        "base_url": f"{upstream_url}/v1",
                        "api_key": "sk-bench-upstream",
                        "rpm": 100_000_000,
                        "burst": 100_000,
                        "timeout": "30s",
                    }
                ],
            }
        ],
        "server": {"log_level": "warning"},
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces; the ppid is the second field after ")".
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def worker_pids(pid: int) -> list[int]:
    """uvicorn's worker processes under ``pid`` (not multiprocessing's resource tracker)."""
    workers = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "resource_tracker" not in cmdline:
            workers.append(child)
    return workers


def bench_target(
    target: Target,
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    duration: float,
    warmup: float,
    log: Callable[[str], None],
) -> TargetResult:
    result = TargetResult(target)
    if target.backend is None:
        url = upstream_url
        process = None
    else:
        port = free_port()
        config = procs.workdir / f"{target.slug}.yaml"
        backend_url = redis_url if target.backend == "redis" else None
        config.write_text(
            yaml.safe_dump(proxy_config(upstream_url, backend_url, target.backend != "nolimit"))
        )
        if backend_url:  # every run starts from empty buckets
            flush_redis(redis_url)
        process = procs.start(
            target.slug,
            [
                sys.executable, "-m", "proxy", "serve", "--config", str(config),
                "--host", LOOPBACK, "--port", str(port), "--workers", str(target.workers),
            ],
        )  # fmt: skip
        url = f"http://{LOOPBACK}:{port}"
        try:
            result.ready_s = wait_until(f"{url}/health/ready", process, timeout=30)
            # Every worker up and settled: the supervisor answers through any of them.
            deadline = time.monotonic() + 10
            while len(worker_pids(process.pid)) < target.workers and target.workers > 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not start")
                time.sleep(0.05)
            time.sleep(1.0)
        except RuntimeError as exc:
            raise RuntimeError(f"{target.label}: {exc}\n{procs.log(target.slug)}") from exc
        if target.workers > 1:
            result.worker_rss_mb = [rss_mb(pid) for pid in worker_pids(process.pid)]
            result.supervisor_rss_mb = rss_mb(process.pid)
        else:
            result.worker_rss_mb = [rss_mb(process.pid)]
    try:
        log(f"{target.label}: warming up {warmup:g} s")
        run_wrk(url, 64, warmup)
        for connections in CONNECTIONS:
            if connections == 1 and process is not None:
                run, result.added_ms = paired_run(url, upstream_url, duration)
            else:
                run = run_wrk(url, connections, duration)
            result.runs[connections] = run
            log(
                f"  {connections:>2} conn: {run.rps:8.0f} req/s  p50 {run.p50_ms:.2f} ms"
                f"  p90 {run.p90_ms:.2f} ms  p99 {run.p99_ms:.2f} ms"
                f"  errors {run.errors}  non-2xx {run.non_2xx}"
            )
    finally:
        if process is not None:
            procs.stop(process)
    return result


def paired_run(url: str, direct_url: str, duration: float) -> tuple[Run, float]:
    """One connection through the proxy in PAIRS slices, each right after a direct slice:
    the proxy's figures are the median slice's, the added latency the median difference."""
    direct: list[Run] = []
    proxied: list[Run] = []
    for _ in range(PAIRS):
        direct.append(run_wrk(direct_url, 1, duration / PAIRS))
        proxied.append(run_wrk(url, 1, duration / PAIRS))
    added = statistics.median(p.p50_ms - d.p50_ms for p, d in zip(proxied, direct, strict=True))
    run = Run(
        connections=1,
        requests=sum(r.requests for r in proxied),
        seconds=sum(r.seconds for r in proxied),
        p50_ms=statistics.median(r.p50_ms for r in proxied),
        p90_ms=statistics.median(r.p90_ms for r in proxied),
        p99_ms=statistics.median(r.p99_ms for r in proxied),
        errors=sum(r.errors for r in proxied),
        non_2xx=sum(r.non_2xx for r in proxied),
    )
    return run, added


def flush_redis(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        client.flushall()


@contextlib.contextmanager
def servers(workdir: Path) -> Iterator[tuple[Processes, str, str]]:
    """The fake upstream (no limits, no latency) and a private redis-server."""
    procs = Processes(workdir)
    try:
        upstream_port, redis_port = free_port(), free_port()
        upstream = procs.start(
            "fake-upstream",
            [sys.executable, "-m", "proxy.fake_upstream", "--host", LOOPBACK,
             "--port", str(upstream_port), "--log-level", "WARNING"],
        )  # fmt: skip
        redis_server = procs.start(
            "redis",
            ["redis-server", "--port", str(redis_port), "--bind", LOOPBACK, "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
        )  # fmt: skip
        upstream_url = f"http://{LOOPBACK}:{upstream_port}"
        wait_until(f"{upstream_url}/stats", upstream, timeout=20)
        redis_url = f"redis://{LOOPBACK}:{redis_port}/0"
        deadline = time.monotonic() + 20
        while True:
            if redis_server.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{procs.log('redis')}")
            try:
                flush_redis(redis_url)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield procs, upstream_url, redis_url
    finally:
        procs.stop_all()


# --- the machine ------------------------------------------------------------------------------


def environment() -> Environment:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) / 1024 / 1024
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = "-"
    return Environment(
        cpu=cpu,
        cores=os.cpu_count() or 0,
        memory_gb=memory,
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        packages=packages,
        tools={
            "wrk": _tool_version(["wrk", "-v"]).split(" Copyright")[0],
            "redis-server": _redis_version(),
        },
        commit=_git_commit(),
    )


class ForeignLoad:
    """Samples /proc every second: CPU time of processes that are not the bench's (not in
    its session, nor in the sessions of the servers it started)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")
        self.foreign_seconds = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> ForeignLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def cores(self) -> float | None:
        return self.foreign_seconds / self.elapsed if self.elapsed > 0 else None

    def _run(self) -> None:
        own = os.getsid(0)
        last = self._sample(own)
        start = time.monotonic()
        while not self._stop.wait(1.0):
            now = self._sample(own)
            for pid, ticks in now.items():
                self.foreign_seconds += max(0, ticks - last.get(pid, ticks)) / self._ticks
            last = now
            self.elapsed = time.monotonic() - start

    @staticmethod
    def _sample(own_session: int) -> dict[int, int]:
        """utime+stime ticks of every foreign process (sessions of our children are ours:
        each was started with start_new_session, so its session id is its own pid)."""
        ours = {own_session, *(p for p in _CHILD_SESSIONS)}
        out: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # After the command name: state ppid pgrp session ... utime(12) stime(13)
            if int(fields[3]) not in ours:
                out[int(entry.name)] = int(fields[11]) + int(fields[12])
        return out


_CHILD_SESSIONS: set[int] = set()  # filled by Processes.start


def _tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except OSError:
        return "-"
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else "-"


def _redis_version() -> str:
    text = _tool_version(["redis-server", "--version"])
    version = next((p for p in text.split() if p.startswith("v=")), "")
    return version[2:] or text


def _git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, cwd=REPO, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "proxy"],
            capture_output=True, text=True, cwd=REPO, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} (with uncommitted changes in proxy/)" if dirty else head


# --- reporting --------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def overhead(report: BenchReport, result: TargetResult) -> tuple[float | None, float | None]:
    """(throughput ratio to direct at 64 connections, added median ms at 1 connection)."""
    direct = report.direct()
    if direct is None or result.target.backend is None:
        return None, None
    ratio = added = None
    if 64 in direct.runs and 64 in result.runs and direct.runs[64].rps:
        ratio = result.runs[64].rps / direct.runs[64].rps
    if result.added_ms is not None:
        added = result.added_ms
    elif 1 in direct.runs and 1 in result.runs:
        added = result.runs[1].p50_ms - direct.runs[1].p50_ms
    return ratio, added


def render_table(report: BenchReport) -> str:
    """The plain-text table printed at the end of a run."""
    header = (
        f"{'target':<30}{'conn':>5}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'errors':>8}{'non-2xx':>9}"
    )
    lines = [header, "-" * len(header)]
    for result in report.results:
        for connections, run in sorted(result.runs.items()):
            lines.append(
                f"{result.target.label:<30}{connections:>5}{run.rps:>9.0f}{run.p50_ms:>9.2f}"
                f"{run.p90_ms:>9.2f}{run.p99_ms:>9.2f}{run.errors:>8}{run.non_2xx:>9}"
            )
    lines.append("")
    lines.append(
        f"{'target':<30}{'rps ratio':>10}{'+p50 ms':>9}{'ready s':>9}{'RSS/worker MB':>15}"
    )
    for result in report.results:
        if result.target.backend is None:
            continue
        ratio, added = overhead(report, result)
        rss = max(result.worker_rss_mb) if result.worker_rss_mb else None
        lines.append(
            f"{result.target.label:<30}{_fmt(ratio, '.2f'):>10}{_fmt(added, '+.2f'):>9}"
            f"{_fmt(result.ready_s, '.2f'):>9}{_fmt(rss, '.0f'):>15}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured


def verdicts(report: BenchReport) -> list[Verdict]:
    """The issue's targets against the measured figures."""
    out = []
    redis2 = report.find("redis", 2)
    run = redis2.runs.get(64) if redis2 else None
    out.append(
        Verdict(
            "throughput (Redis, 2 workers, 64 connections, auth + metrics)",
            f">= {TARGET_RPS:,.0f} req/s",
            _fmt(run.rps if run else None, ",.0f", " req/s"),
            None if run is None else run.rps >= TARGET_RPS,
        )
    )
    for backend, label in (("memory", "memory"), ("redis", "Redis")):
        result = report.find(backend, 1)
        added = overhead(report, result)[1] if result else None
        out.append(
            Verdict(
                f"added median latency at 1 connection ({label}, 1 worker)",
                f"<= +{TARGET_ADDED_MS:g} ms",
                _fmt(added, "+.2f", " ms"),
                None if added is None else added <= TARGET_ADDED_MS,
            )
        )
    rss = [mb for r in report.results for mb in r.worker_rss_mb]
    out.append(
        Verdict(
            "idle memory per worker (largest)",
            f"< {TARGET_RSS_MB:g} MB",
            _fmt(max(rss) if rss else None, ".0f", " MB"),
            None if not rss else max(rss) < TARGET_RSS_MB,
        )
    )
    ready = [r.ready_s for r in report.results if r.ready_s is not None]
    out.append(
        Verdict(
            "start to ready (slowest)",
            f"<= {TARGET_READY_S:g} s",
            _fmt(max(ready) if ready else None, ".2f", " s"),
            None if not ready else max(ready) <= TARGET_READY_S,
        )
    )
    return out


def render_markdown(report: BenchReport) -> str:
    """docs/benchmarks.md."""
    env = report.environment
    md = [
        "# Benchmarks",
        "",
        "Measured by `make bench` (`loadtest/bench.py`); regenerate this page with it. The"
        " figures are one run on the machine below: they are only comparable with runs on"
        " the same machine.",
        "",
        "Non-streamed chat completions (`max_tokens` 16) sent by [wrk](https://github.com/wg/wrk)"
        " (one thread, `loadtest/bench_chat.lua`) for"
        f" {report.duration:g} s per row after a warm-up, at 1 and at 64 connections:"
        " directly to the built-in fake upstream (no latency, no limits), and through the"
        " proxy with the in-memory limiter and with the Redis limiter (a private"
        " redis-server), 1 and 2 workers. Every proxy request carries a client key (auth),"
        " metrics are on, and the key's and the deployment's limits are set so high that no"
        " request ever waits: what is measured is the proxy's own cost. Everything —"
        " wrk, the fake upstream, Redis and the proxy — shares the same machine.",
        "",
        "## Targets",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for v in verdicts(report):
        met = "n/a" if v.met is None else ("yes" if v.met else "**no**")
        md.append(f"| {v.name} | {v.target} | {v.measured} | {met} |")
    md += [
        "",
        "## Throughput and latency",
        "",
        "| target | connections | req/s | p50 ms | p90 ms | p99 ms | errors | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in report.results:
        for connections, run in sorted(result.runs.items()):
            md.append(
                f"| {result.target.label} | {connections} | {run.rps:,.0f} | {run.p50_ms:.2f}"
                f" | {run.p90_ms:.2f} | {run.p99_ms:.2f} | {run.errors} | {run.non_2xx} |"
            )
    md += [
        "",
        "## The proxy's overhead, memory and start-up",
        "",
        "Throughput ratio: the proxy's req/s at 64 connections over the direct run's. Added"
        " median: the proxy's p50 minus the direct run's p50, at 1 connection, measured in"
        f" {PAIRS} pairs of slices (a direct slice, then one through the proxy) and taken as"
        " the median of the pairs' differences, so the machine's drift during the run"
        " cancels out (the proxy's 1-connection row shows its median slice). RSS: resident"
        " memory of each worker process when idle, after start-up (with 2 workers, uvicorn's"
        " supervising parent is listed apart). Ready: from starting `llm-proxy serve` to the"
        " first 200 from `/health/ready`.",
        "",
        "| target | throughput ratio | added median | RSS per worker | supervisor RSS | ready |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for result in report.results:
        if result.target.backend is None:
            continue
        ratio, added = overhead(report, result)
        rss = ", ".join(f"{mb:.0f} MB" for mb in result.worker_rss_mb) or "n/a"
        md.append(
            f"| {result.target.label} | {_fmt(ratio, '.2f', 'x')} | {_fmt(added, '+.2f', ' ms')}"
            f" | {rss} | {_fmt(result.supervisor_rss_mb, '.0f', ' MB')}"
            f" | {_fmt(result.ready_s, '.2f', ' s')} |"
        )
    if report.chart:
        md += ["", f"![req/s at 64 connections and p50 at 1 connection]({report.chart})"]
    md += [
        "",
        "## Machine and versions",
        "",
        f"- CPU: {env.cpu}, {env.cores} cores; memory {env.memory_gb:.1f} GiB; {env.system}",
        f"- Python {env.python}; "
        + ", ".join(f"{name} {version}" for name, version in env.packages.items()),
        "- " + "; ".join(f"{tool}: {version}" for tool, version in env.tools.items()),
        f"- code: commit {env.commit}",
        f"- other processes on the machine (not the bench's) used"
        f" {_fmt(env.foreign_cores, '.2f')} cores on average during the run; above about 0.1,"
        " they took CPU from the measured servers and every figure is lower for it",
        "",
        "## Command",
        "",
        "```sh",
        report.command,
        "```",
        "",
    ]
    return "\n".join(md)


# --- the chart --------------------------------------------------------------------------------


def write_chart(report: BenchReport, path: Path) -> None:
    """Two bar charts: req/s at 64 connections, p50 at 1 connection, one bar per target."""
    labels = [
        r.target.label.replace("direct to the fake upstream", "direct") for r in report.results
    ]
    rps = [r.runs[64].rps if 64 in r.runs else 0.0 for r in report.results]
    p50 = [r.runs[1].p50_ms if 1 in r.runs else 0.0 for r in report.results]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png(path, [rps, p50])
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    short = [label.replace("proxy, ", "").replace(", ", "\n") for label in labels]
    colors = ["#888888"] + ["#3b75af"] * (len(labels) - 1)
    left.bar(short, rps, color=colors)
    left.set_title("requests/s at 64 connections")
    left.axhline(TARGET_RPS, color="#c44e52", linestyle="--", linewidth=1)
    left.text(len(short) - 0.5, TARGET_RPS, f" target {TARGET_RPS:,.0f}", va="bottom", ha="right")
    right.bar(short, p50, color=colors)
    right.set_title("median latency (ms) at 1 connection")
    for axis, values, spec in ((left, rps, ",.0f"), (right, p50, ".2f")):
        for i, value in enumerate(values):
            axis.text(i, value, f"{value:{spec}}", ha="center", va="bottom", fontsize=8)
        axis.tick_params(axis="x", labelsize=8)
    fig.suptitle("llm-proxy: non-streamed chat completions via wrk (direct vs. through the proxy)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_png(path: Path, groups: Sequence[Sequence[float]], height: int = 200) -> None:
    """A bare bar chart (no text), one panel per group, as an RGB PNG: the fallback when
    matplotlib is not installed. The figures are in the tables; this only shows shape."""
    bar, gap, pad = 24, 8, 16
    panel = max(len(g) for g in groups) * (bar + gap) + gap
    width = len(groups) * panel + (len(groups) + 1) * pad
    rows = [bytearray(b"\xff\xff\xff" * width) for _ in range(height)]
    for g, values in enumerate(groups):
        top = max(values) or 1.0
        x0 = pad + g * (panel + pad)
        for i, value in enumerate(values):
            color = b"\x88\x88\x88" if i == 0 else b"\x3b\x75\xaf"
            h = round((height - 2 * pad) * value / top)
            left = x0 + gap + i * (bar + gap)
            for y in range(height - pad - h, height - pad):
                rows[y][left * 3 : (left + bar) * 3] = color * bar
        for x in range(x0, x0 + panel):  # the axis
            rows[height - pad][x * 3 : x * 3 + 3] = b"\x00\x00\x00"
    raw = b"".join(b"\x00" + bytes(row) for row in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown report")
    parser.add_argument("--no-chart", action="store_true", help="no PNG")
    parser.add_argument(
        "--only", action="append", default=[], help="target slugs (direct, memory-1w, ...)"
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
    with (
        ForeignLoad() as foreign,
        tempfile.TemporaryDirectory(prefix="llmproxy-bench-") as tmp,
        servers(Path(tmp)) as (procs, upstream_url, redis_url),
    ):
        for target in targets:
            results.append(
                bench_target(
                    target, procs, upstream_url, redis_url, args.duration, args.warmup, print
                )
            )
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
    print(f"CPU used by other processes during the run: {_fmt(foreign.cores, '.2f')} cores")
    args.output.write_text(render_markdown(report))
    print(f"\nwrote {args.output} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
