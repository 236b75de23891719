"""The processes a benchmark starts: the fake upstream, Redis, proxies (the work tree's, or
a baseline revision's) and the peer gateway, all in their own process groups, all stopped
at the end."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from loadtest.bench import peer, peer_gateway
from loadtest.bench.configs import proxy_config
from loadtest.bench.model import CONNECTIONS, PEER, Target, TargetResult
from loadtest.bench.wrk import paired_run, run_wrk
from loadtest.topology import LOOPBACK, REPO, free_port

CHILD_SESSIONS: set[int] = set()  # filled by Processes.start (machine.ForeignLoad reads it)


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
        self.named: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        source: Path = REPO,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``source`` (a checkout whose ``proxy`` package it imports),
        with ``env`` if given (else ``source_env(source)``)."""
        with (self.workdir / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=source,
                env=source_env(source) if env is None else env,
                start_new_session=True,
            )
        self.started.append(process)
        self.named[name] = process
        CHILD_SESSIONS.add(process.pid)
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


def source_env(source: Path) -> dict[str, str]:
    """The environment of a process that must import ``proxy`` from ``source``: first on
    the path, before the work tree the venv installed in editable mode."""
    env = dict(os.environ)
    if source != REPO:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(source), env.get("PYTHONPATH")) if p)
    return env


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
    sources: dict[str, Path] | None = None,
) -> TargetResult:
    """``sources``: the checkout of each baseline revision."""
    result = TargetResult(target)
    if target.backend is None:
        url = upstream_url
        process = None
    else:
        process, url, result.ready_s = start_server(target, procs, upstream_url, redis_url, sources)
        if target.workers > 1:
            result.worker_rss_mb = [rss_mb(pid) for pid in worker_pids(process.pid)]
            result.supervisor_rss_mb = rss_mb(process.pid)
        else:
            result.worker_rss_mb = [rss_mb(process.pid)]
    try:
        log(f"{target.label}: warming up {warmup:g} s")
        run_wrk(url, 64, warmup, target.path, target.model)
        for connections in CONNECTIONS:
            if connections == 1 and process is not None:
                run, result.added_ms = paired_run(
                    url, upstream_url, duration, target.path, target.model
                )
            else:
                run = run_wrk(url, connections, duration, target.path, target.model)
            result.runs[connections] = run
            log(
                f"  {connections:>2} conn: {run.rps:8.0f} req/s  p50 {run.p50_ms:.2f} ms"
                f"  p90 {run.p90_ms:.2f} ms  p99 {run.p99_ms:.2f} ms"
                f"  errors {run.errors}  non-2xx {run.non_2xx}"
            )
        # The peer must have talked to 127.0.0.1 only (its config and environment see to
        # it: loadtest/bench/peer.py); what it holds open after its runs is checked.
        if target.peer and process is not None and (foreign := foreign_remotes(process.pid)):
            raise PeerUnavailable(f"it connected beyond 127.0.0.1: {', '.join(foreign)}")
    finally:
        if process is not None:
            procs.stop(process)
    return result


def start_server(
    target: Target,
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    sources: dict[str, Path] | None = None,
    name: str | None = None,
) -> tuple[subprocess.Popen[bytes], str, float]:
    """The server of ``target``, a proxy or the peer, ready: (process, URL, seconds)."""
    if target.peer:
        return start_peer(procs, upstream_url, redis_url, name or target.slug, target.config)
    return start_proxy(target, procs, upstream_url, redis_url, sources, name)


class PeerUnavailable(RuntimeError):
    """The peer gateway could not be started (not installed, or it failed): the bench
    goes on without it and says why."""


def start_peer(
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    name: str = "tensorzero",
    rule: str = peer.DEFAULT_RULE,
) -> tuple[subprocess.Popen[bytes], str, float]:
    """TensorZero's gateway (loadtest/bench/peer.py) with its rate-limit ``rule``, its
    first chat completion answered: (its process, its URL, seconds from start to that
    answer)."""
    config = procs.workdir / f"{name}.toml"
    config.write_text(peer.tensorzero_config(upstream_url, rule))
    started = time.perf_counter()
    process = procs.start(
        name,
        [sys.executable, "-m", "loadtest.bench.peer_gateway", str(config),
         peer.valkey_url(redis_url)],
        env=peer.gateway_env(os.environ),
    )  # fmt: skip
    try:
        base_url = _announced_url(procs, name, process, timeout=60)
        # Its origin: the target's path is the whole route (/openai/v1/chat/completions).
        parts = urllib.parse.urlsplit(base_url)
        url = f"{parts.scheme}://{parts.netloc}"
        _first_completion(url, timeout=30)
    except (RuntimeError, OSError) as exc:
        procs.stop(process)
        raise PeerUnavailable(f"{exc}\n{procs.log(name)}") from exc
    return process, url, time.perf_counter() - started


def _announced_url(
    procs: Processes, name: str, process: subprocess.Popen[bytes], timeout: float
) -> str:
    """The URL peer_gateway prints once its gateway serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in procs.log(name).splitlines():
            if line.startswith(peer_gateway.READY + " "):
                return line.split(maxsplit=1)[1].strip()
        if process.poll() is not None:
            if process.returncode == peer_gateway.UNAVAILABLE:
                raise RuntimeError("tensorzero is not installed (`make bench` installs it)")
            raise RuntimeError(f"the gateway exited with {process.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"the gateway did not start within {timeout:g} s")


def _first_completion(url: str, timeout: float) -> None:
    """Poll the peer's chat route with the bench's body until it answers 200."""
    body = (
        f'{{"model":"{PEER.model}","max_tokens":16,'
        '"messages":[{"role":"user","content":"ready?"}]}'
    ).encode()
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(  # noqa: S310 (loopback)
            url + PEER.path, body, {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
                if response.status == 200:
                    return
                failure = f"status {response.status}"
        except (urllib.error.URLError, OSError) as exc:
            failure = str(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no completion from the gateway: {failure}")
        time.sleep(0.05)


def start_proxy(
    target: Target,
    procs: Processes,
    upstream_url: str,
    redis_url: str,
    sources: dict[str, Path] | None = None,
    name: str | None = None,
) -> tuple[subprocess.Popen[bytes], str, float]:
    """A proxy for ``target`` (from its baseline's checkout in ``sources``), every worker
    up and settled: (its process, its URL, seconds from start to ready)."""
    assert target.backend is not None
    name = name or target.slug
    backend_url = redis_url if target.backend == "redis" else None
    settings = proxy_config(upstream_url, backend_url, target.backend != "nolimit", target.config)
    if backend_url:  # every run starts from empty buckets
        flush_redis(redis_url)
    source = (sources or {}).get(target.baseline or "", REPO)
    try:
        return serve_config(procs, name, settings, target.workers, source)
    except RuntimeError as exc:
        raise RuntimeError(f"{target.label}: {exc}") from exc


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # 100,000 keys: seconds, not minutes


def serve_config(
    procs: Processes,
    name: str,
    settings: dict[str, object],
    workers: int = 1,
    source: Path = REPO,
    ready_timeout: float = 30.0,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, float]:
    """``llm-proxy serve`` on ``settings`` (written to ``name``.yaml) from ``source``,
    with ``extra_env`` (e.g. a fast path turned off), every worker up and settled: (its
    process, its URL, seconds from start to ready)."""
    port = free_port()
    config = procs.workdir / f"{name}.yaml"
    config.write_text(yaml.dump(settings, Dumper=_DUMPER, sort_keys=False))
    process = procs.start(
        name,
        [
            sys.executable, "-m", "proxy", "serve", "--config", str(config),
            "--host", LOOPBACK, "--port", str(port), "--workers", str(workers),
        ],
        source=source,
        env={**source_env(source), **extra_env} if extra_env else None,
    )  # fmt: skip
    url = f"http://{LOOPBACK}:{port}"
    try:
        ready_s = wait_until(f"{url}/health/ready", process, timeout=ready_timeout)
        # Every worker up and settled: the supervisor answers through any of them.
        deadline = time.monotonic() + 10
        while len(worker_pids(process.pid)) < workers and workers > 1:
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        time.sleep(1.0)
    except RuntimeError as exc:
        procs.stop(process)
        raise RuntimeError(f"{name}: {exc}\n{procs.log(name)}") from exc
    return process, url, ready_s


def remote_addresses(table: str) -> dict[int, str]:
    """Socket inode -> remote IP, from a /proc/net/{tcp,udp}[6] table (sockets without a
    remote, such as listening ones, left out). Addresses are hex, in host (little-endian)
    byte order by 32-bit word."""
    found = {}
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        address = fields[2].split(":")[0]
        words = [bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8)]
        ip = ipaddress.ip_address(b"".join(words))
        if not ip.is_unspecified:
            found[int(fields[9])] = str(ip)
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` has open now."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def established() -> list[tuple[int, int, int]]:
    """(local port, remote port, socket inode) of this machine's established TCP
    connections, from /proc/net/tcp and tcp6."""
    found = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01":  # TCP_ESTABLISHED
                    local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                    found.append((local, remote, int(fields[9])))
    return found


def served_on(port: int) -> set[int]:
    """The inodes of the established TCP connections whose local port is ``port``."""
    return {inode for local, _, inode in established() if local == port}


def connections_by_worker(pid: int, port: int) -> dict[int, int]:
    """Worker pid -> the connections to ``port`` it holds, for the workers of ``pid``."""
    served = served_on(port)
    return {worker: len(socket_inodes(worker) & served) for worker in sorted(worker_pids(pid))}


def foreign_remotes(pid: int) -> list[str]:
    """The remote IPs, other than loopback, of the sockets ``pid`` has open now."""
    inodes = socket_inodes(pid)
    remotes: dict[int, str] = {}
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            remotes.update(remote_addresses(Path(f"/proc/{pid}/net/{table}").read_text()))
    return sorted({ip for inode, ip in remotes.items() if inode in inodes and not is_loopback(ip)})


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` and of its live worker processes."""
    total = 0.0
    for each in (pid, *worker_pids(pid)):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def flush_redis(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        client.flushall()


@contextlib.contextmanager
def servers(workdir: Path) -> Iterator[tuple[Processes, str, str]]:
    """The fake upstream (no limits, no latency) and a private redis-server."""
    procs = Processes(workdir)
    try:
        upstream_port = free_port()
        upstream = procs.start(
            "fake-upstream",
            [sys.executable, "-m", "proxy.fake_upstream", "--host", LOOPBACK,
             "--port", str(upstream_port), "--log-level", "WARNING"],
        )  # fmt: skip
        redis_url = start_redis(procs)
        upstream_url = f"http://{LOOPBACK}:{upstream_port}"
        wait_until(f"{upstream_url}/stats", upstream, timeout=20)
        yield procs, upstream_url, redis_url
    finally:
        procs.stop_all()


def start_redis(procs: Processes) -> str:
    """A private redis-server (no persistence, in the processes' work directory),
    answering and empty: its URL."""
    port = free_port()
    redis_server = procs.start(
        "redis",
        ["redis-server", "--port", str(port), "--bind", LOOPBACK, "--save", "",
         "--appendonly", "no", "--dir", str(procs.workdir)],
    )  # fmt: skip
    url = f"redis://{LOOPBACK}:{port}/0"
    deadline = time.monotonic() + 20
    while True:
        if redis_server.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{procs.log('redis')}")
        try:
            flush_redis(url)
            return url
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def trees(baseline: str | None) -> Iterator[dict[str, Path]]:
    """The trees a before-and-after tool measures, by name: this work tree (``now``) and,
    with ``baseline``, that revision checked out (named by it) while the block runs."""
    with contextlib.ExitStack() as stack:
        found = {"now": REPO}
        if baseline:
            found[baseline] = stack.enter_context(checkout(baseline))
        yield found


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """``revision`` of this repository in a temporary directory (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="llmproxy-baseline-") as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", revision],
            cwd=REPO, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True, timeout=60)
        yield Path(tmp)
