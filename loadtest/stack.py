"""The compose stack as plain local processes on 127.0.0.1 (no Docker).

    python -m loadtest.stack up        # make stack: run until Ctrl-C, print the URLs
    python -m loadtest.stack locust    # make stack-locust: 60 s headless Locust + the check
    python -m loadtest.stack plan      # print the local commands derived from the compose file

The service list, commands, environment and mounted configs come from docker-compose.yml
(``loadtest.topology``): redis-server, the two fake upstreams, the two proxy replicas, a
Python TCP round-robin balancer in place of nginx (``loadtest.tcp_lb``), Prometheus when
its binary is installed, and the Locust master and workers. Grafana is skipped (the compose
stack runs it). Logs go to ``.stack/<service>.log``; Ctrl-C or SIGTERM stops everything
(SIGTERM to each process group, SIGKILL after a grace period).

The ``locust`` command drives the load balancer above the combined upstream limit and
then checks the yardstick of the design: the fake upstreams answered no 429 at all, and
served at least 95% of their combined limit over the measured window.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from loadtest.topology import (
    COMPOSE_FILE,
    LOOPBACK,
    REPO,
    LocalService,
    load_compose,
    local_plan,
    start_order,
)

DEFAULT_WORKDIR = REPO / ".stack"
START_TIMEOUT = 60.0
STOP_GRACE = 10.0


class StackError(RuntimeError):
    pass


@dataclass
class _Process:
    name: str  # the service name, with "-N" for replicas
    service: LocalService
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Stack:
    """Starts the services of a plan in dependency order; ``stop()`` ends them all."""

    plan: dict[str, LocalService]
    workdir: Path
    skip: frozenset[str] = frozenset()  # services not to start (beyond the plan's skips)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for all
    processes: list[_Process] = field(default_factory=list)

    @classmethod
    def from_compose(
        cls,
        workdir: Path = DEFAULT_WORKDIR,
        *,
        compose: Path = COMPOSE_FILE,
        free_ports: bool = False,
        skip: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Stack:
        """The plan for ``compose``; variables come from os.environ overlaid with ``env``."""
        workdir = workdir.resolve()
        merged = {**os.environ, **(env or {})}
        plan = local_plan(load_compose(compose, merged), workdir, free_ports=free_ports)
        unknown = set(skip) - set(plan)
        if unknown:
            raise StackError(f"no such services: {sorted(unknown)}")
        return cls(plan, workdir, frozenset(skip), dict(env or {}))

    # --- what runs ------------------------------------------------------------------------

    def running(self, name: str) -> bool:
        service = self.plan[name]
        return service.skip is None and name not in self.skip

    def of_kind(self, kind: str) -> list[LocalService]:
        return [s for n, s in self.plan.items() if s.kind == kind and self.running(n)]

    def url(self, name: str) -> str:
        url = self.plan[name].url
        if url is None:
            raise StackError(f"{name} has no port")
        return url

    @property
    def lb_url(self) -> str:
        return self.url(self.of_kind("lb")[0].name)

    # --- life cycle -----------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> Stack:
        if self.processes:
            raise StackError("the stack is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for wave in start_order(self.plan):
                started = [self._start(name) for name in wave if self.running(name)]
                deadline = time.monotonic() + timeout
                for service in started:
                    self._wait_ready(service, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str) -> LocalService:
        service = self.plan[name]
        for path, text in service.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if service.kind == "redis":
            (self.workdir / name).mkdir(parents=True, exist_ok=True)
        for i in range(service.replicas):
            label = name if service.replicas == 1 else f"{name}-{i + 1}"
            self.processes.append(self.spawn(label, service, service.argv))
        return service

    def spawn(self, label: str, service: LocalService, argv: list[str]) -> _Process:
        """Start ``argv`` with ``service``'s environment, logging to ``<label>.log``."""
        log = self.workdir / f"{label}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env, **service.env},
                cwd=REPO,
                start_new_session=True,  # its own process group: workers stop with it
            )
        return _Process(label, service, popen, log)

    def _wait_ready(self, service: LocalService, deadline: float) -> None:
        while True:
            dead = self.dead()
            if dead:
                raise StackError(f"{dead.name} exited during start-up:\n{tail(dead.log)}")
            if _is_ready(service):
                return
            if time.monotonic() > deadline:
                raise StackError(f"{service.name} not ready in time:\n{self._tail(service)}")
            time.sleep(0.05)

    def _tail(self, service: LocalService) -> str:
        logs = [p.log for p in self.processes if p.service is service]
        return "\n".join(tail(log) for log in logs)

    def dead(self) -> _Process | None:
        """A process that exited although nobody asked it to."""
        return next((p for p in self.processes if p.popen.poll() is not None), None)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every process, dependents first (the balancer before the proxies, the
        proxies before Redis), each with SIGTERM to its group and SIGKILL after ``grace``."""
        processes, self.processes = list(reversed(self.processes)), []
        for process in processes:
            _signal_group(process.popen, signal.SIGTERM)
            try:
                process.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(process.popen, signal.SIGKILL)
                process.popen.wait(timeout=5)
            # A parent gone leaves no stragglers: uvicorn workers share its group.
            _signal_group(process.popen, signal.SIGKILL)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def describe(self) -> str:
        lines = []
        for name, service in self.plan.items():
            if service.skip is not None:
                lines.append(f"  {name:<14} skipped: {service.skip}")
            elif name in self.skip:
                lines.append(f"  {name:<14} not started")
            else:
                where = service.url or "(no port)"
                count = f" x{service.replicas}" if service.replicas > 1 else ""
                lines.append(f"  {name:<14} {where}{count}   log: {self._log_name(name)}")
        return "\n".join(lines)

    def usage(self) -> str:
        """How to use the running stack: its client keys, the README's example.py and a
        headless Locust command (the README's), pointing at this balancer."""
        keys = self.plan["locust-master"].env.get("LOCUST_API_KEYS", "")
        csv = os.path.relpath(self.workdir / "locust", Path.cwd())
        return "\n".join(
            [
                f"proxy (through the balancer): {self.lb_url}/v1",
                f"client keys (config/stack/proxy.yaml): {keys.replace(',', ', ')}",
                "the README's example (the OpenAI SDK): OPENAI_BASE_URL="
                f"{self.lb_url}/v1 OPENAI_API_KEY={keys.split(',')[0]} .venv/bin/python example.py",
                "headless Locust (the keys are its defaults): .venv/bin/locust -f"
                " loadtest/locustfile.py --headless -u 250 -r 60 -t 60s"
                f" --host {self.lb_url} --processes 2 --csv {csv}",
            ]
        )

    def _log_name(self, name: str) -> str:
        service = self.plan[name]
        label = name if service.replicas == 1 else f"{name}-N"
        return os.path.relpath(self.workdir / f"{label}.log", Path.cwd())


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _is_ready(service: LocalService) -> bool:
    if service.port is None:  # a worker: alive is ready
        return True
    if service.kind == "redis":
        return _redis_ping(service.port)
    if service.ready_path is None:
        return False
    return http_status(f"{service.url}{service.ready_path}") == 200


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def http_status(url: str, timeout: float = 2.0) -> int:
    """Status of a GET (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
        return json.load(response)


def tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return ""


# --- the headless Locust run and its check ----------------------------------------------------


@dataclass(frozen=True)
class LocustRun:
    """A bounded headless run: ``warmup`` s of ramp, then ``window`` s measured."""

    users: int = 250
    user_rate: float = 2.0  # requests per second per user (0: no pacing, closed loop)
    window: float = 60.0
    warmup: float = 5.0
    workers: int | None = None  # None: as many as the compose file's locust-worker replicas
    csv_prefix: Path = DEFAULT_WORKDIR / "locust"
    min_share: float = 0.95

    @property
    def spawn_rate(self) -> float:
        # Ramp over most of the warm-up: 250 users at once open ~250 connections in the
        # same instant, a start-up storm no real client fleet makes.
        return max(1.0, self.users / max(1.0, self.warmup * 0.8))

    @property
    def run_time(self) -> int:
        # Locust's clock starts at spawning, ours at the first served request: keep margin.
        return int(self.warmup + self.window + 5)


@dataclass
class UpstreamWindow:
    name: str
    limit_per_s: float
    served: int
    rejected_total: int
    peak_window_requests: int
    limit_per_window: int


@dataclass
class LocustReport:
    run: LocustRun
    seconds: float
    upstreams: list[UpstreamWindow]
    locust_rows: list[dict[str, str]]
    demand_per_s: float | None  # offered: users x per-user rate

    @property
    def limit_per_s(self) -> float:
        return sum(u.limit_per_s for u in self.upstreams)

    @property
    def served_per_s(self) -> float:
        return sum(u.served for u in self.upstreams) / self.seconds

    @property
    def share(self) -> float:
        return self.served_per_s / self.limit_per_s

    @property
    def rejected(self) -> int:
        return sum(u.rejected_total for u in self.upstreams)

    @property
    def ok(self) -> bool:
        return self.rejected == 0 and self.share >= self.run.min_share

    def render(self) -> str:
        lines = ["Locust (whole run, from its CSV):"]
        lines.append(
            f"  {'name':<22}{'requests':>10}{'failures':>10}{'req/s':>9}"
            f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
        )
        for row in self.locust_rows:
            lines.append(
                f"  {row['Name']:<22}{row['Request Count']:>10}{row['Failure Count']:>10}"
                f"{float(row['Requests/s']):>9.1f}{row['50%']:>9}{row['95%']:>9}{row['99%']:>9}"
            )
        sent = [r for r in self.locust_rows if r["Type"] == "POST"]
        if sent:
            rate = sum(float(r["Requests/s"]) for r in sent)
            failed = sum(int(r["Failure Count"]) for r in sent)
            lines.append(f"  requests answered: {rate:.1f}/s ({failed} failed)")
        if self.demand_per_s is not None:
            lines.append(
                f"  offered demand: {self.run.users} users x {self.run.user_rate:g} req/s ="
                f" {self.demand_per_s:.0f} req/s ({self.demand_per_s / self.limit_per_s:.2f}x"
                " the combined limit)"
            )
        lines.append(
            f"Fake upstreams, measured over {self.seconds:.1f} s after a"
            f" {self.run.warmup:g} s warm-up:"
        )
        for u in self.upstreams:
            lines.append(
                f"  {u.name}: served {u.served} ({u.served / self.seconds:.1f}/s of"
                f" {u.limit_per_s:.1f}/s), 429s since start: {u.rejected_total},"
                f" peak requests in one window: {u.peak_window_requests}/{u.limit_per_window}"
            )
        lines.append(
            f"  combined: {self.served_per_s:.1f}/s of {self.limit_per_s:.1f}/s ="
            f" {self.share:.1%} of the limit (need >= {self.run.min_share:.0%}),"
            f" upstream 429s: {self.rejected} (need 0)"
        )
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def _flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _headless_master_argv(master: LocalService, run: LocustRun, workers: int) -> list[str]:
    """The compose master's command, headless: no web UI, fixed users, time and CSV."""
    argv: list[str] = []
    skip_next = False
    for arg in master.argv:
        if skip_next:
            skip_next = False
            continue
        if arg in ("--web-port", "--web-host"):
            skip_next = True
            continue
        argv.append(arg)
    return [
        *argv,
        "--headless",
        "--users", str(run.users),
        "--spawn-rate", f"{run.spawn_rate:g}",
        "--run-time", f"{run.run_time}s",
        "--expect-workers", str(workers),
        "--expect-workers-max-wait", "30",
        "--stop-timeout", "5",
        "--csv", str(run.csv_prefix),
        "--only-summary",
    ]  # fmt: skip


def run_locust(stack: Stack, run: LocustRun, log: Callable[[str], None] = print) -> LocustReport:
    """Run Locust headless against the stack's balancer, measure the upstreams, report.

    Bounded: Locust stops itself after ``run.run_time`` s; it is killed 60 s after that.
    """
    masters = [s for s in stack.plan.values() if s.kind == "locust-master"]
    workers = [s for s in stack.plan.values() if s.kind == "locust-worker"]
    if not masters or not workers:
        raise StackError("the compose file has no locust master and worker")
    master, worker = masters[0], workers[0]
    count = run.workers or worker.replicas
    env = {"LOCUST_USER_RATE": f"{run.user_rate:g}" if run.user_rate > 0 else ""}
    upstreams = stack.of_kind("fake-upstream")
    run.csv_prefix.parent.mkdir(parents=True, exist_ok=True)
    started: list[_Process] = []
    try:
        master_env = {**master.env, **env}
        started.append(
            stack.spawn(
                "locust-headless",
                _with_env(master, master_env),
                _headless_master_argv(master, run, count),
            )
        )
        for i in range(count):
            started.append(
                stack.spawn(
                    f"locust-headless-worker-{i + 1}",
                    _with_env(worker, {**worker.env, **env}),
                    worker.argv,
                )
            )
        _wait_for_traffic(upstreams, started, timeout=45.0)
        log(f"traffic is flowing; warming up {run.warmup:g} s, then measuring {run.window:g} s")
        time.sleep(run.warmup)
        t0 = time.monotonic()
        first = {u.name: get_json(f"{u.url}/stats") for u in upstreams}
        time.sleep(run.window)
        last = {u.name: get_json(f"{u.url}/stats") for u in upstreams}
        seconds = time.monotonic() - t0
        try:
            started[0].popen.wait(timeout=run.run_time + 60)
        except subprocess.TimeoutExpired as exc:
            raise StackError("locust did not stop by itself") from exc
    finally:
        for process in started:
            _signal_group(process.popen, signal.SIGTERM)
        for process in started:
            try:
                process.popen.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                _signal_group(process.popen, signal.SIGKILL)
                process.popen.wait(timeout=5)
    windows = []
    for u in upstreams:
        rpm = int(_flag_value(u.argv, "--rpm"))
        window = float(_flag_value(u.argv, "--window"))
        windows.append(
            UpstreamWindow(
                name=u.name,
                limit_per_s=rpm / window,
                served=last[u.name]["served"] - first[u.name]["served"],
                rejected_total=last[u.name]["rejected"],
                peak_window_requests=last[u.name]["peak_window_requests"],
                limit_per_window=rpm,
            )
        )
    demand = run.users * run.user_rate if run.user_rate > 0 else None
    return LocustReport(run, seconds, windows, read_locust_csv(run.csv_prefix), demand)


def _with_env(service: LocalService, env: dict[str, str]) -> LocalService:
    return LocalService(
        name=service.name, kind=service.kind, argv=service.argv, env=env, ports=service.ports
    )


def _wait_for_traffic(
    upstreams: list[LocalService], processes: list[_Process], timeout: float
) -> None:
    """Return once every upstream served a request of this run (Locust has spawned)."""
    start = {u.name: get_json(f"{u.url}/stats")["served"] for u in upstreams}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.popen.poll() is not None:
                raise StackError(f"{process.name} exited:\n{tail(process.log)}")
        now = {u.name: get_json(f"{u.url}/stats")["served"] for u in upstreams}
        if all(now[n] > start[n] for n in start):
            return
        time.sleep(0.2)
    raise StackError("no traffic reached the upstreams: see .stack/locust-headless.log")


def read_locust_csv(prefix: Path) -> list[dict[str, str]]:
    """The rows of Locust's ``<prefix>_stats.csv`` (one per request name, plus Aggregated)."""
    path = Path(f"{prefix}_stats.csv")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --- command line ---------------------------------------------------------------------------


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _cmd_up(args: argparse.Namespace) -> int:
    skip = set(args.skip)
    if args.no_locust:
        skip |= {"locust-master", "locust-worker"}
    stack = Stack.from_compose(args.workdir, free_ports=args.free_ports, skip=skip)
    stop = threading.Event()
    _stop_on_signals(stop)
    print(f"starting the stack of {COMPOSE_FILE.name} as local processes ...", flush=True)
    with stack:
        print(stack.describe())
        print(f"{stack.usage()}\nCtrl-C stops", flush=True)
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stop.wait(0.5):
            dead = stack.dead()
            if dead is not None:
                print(f"{dead.name} exited:\n{tail(dead.log)}", file=sys.stderr)
                return 1
            if deadline is not None and time.monotonic() > deadline:
                break
        print("stopping ...", flush=True)
    return 0


def _cmd_locust(args: argparse.Namespace) -> int:
    skip = set(args.skip) | {"locust-master", "locust-worker"}
    stack = Stack.from_compose(args.workdir, free_ports=args.free_ports, skip=skip)
    run = LocustRun(
        users=args.users,
        user_rate=args.user_rate,
        window=args.window,
        warmup=args.warmup,
        workers=args.workers,
        csv_prefix=(args.csv or stack.workdir / "locust").resolve(),
        min_share=args.min_share,
    )
    with stack:
        print(stack.describe(), flush=True)
        report = run_locust(stack, run)
    text = report.render()
    print(text)
    (stack.workdir / "locust-report.txt").write_text(text + "\n")
    print(f"Locust CSV: {run.csv_prefix}_stats.csv", flush=True)
    return 0 if report.ok or args.no_check else 1


def _cmd_plan(args: argparse.Namespace) -> int:
    stack = Stack.from_compose(args.workdir, free_ports=args.free_ports)
    for name, service in stack.plan.items():
        if service.skip:
            print(f"# {name}: skipped: {service.skip}")
            continue
        env = " ".join(f"{k}={v}" for k, v in service.env.items())
        count = f" (x{service.replicas})" if service.replicas > 1 else ""
        print(f"# {name}{count}\n{env + ' ' if env else ''}{shlex.join(service.argv)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.stack", description=__doc__)
    parser.set_defaults(func=None)
    sub = parser.add_subparsers()

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="logs and data")
        p.add_argument("--free-ports", action="store_true", help="any free loopback ports")
        p.add_argument("--skip", action="append", default=[], help="a service not to start")

    up = sub.add_parser("up", help="run the stack until Ctrl-C")
    common(up)
    up.add_argument("--no-locust", action="store_true", help="no Locust master and workers")
    up.add_argument("--duration", type=float, default=0, help="stop after S seconds")
    up.set_defaults(func=_cmd_up)

    loc = sub.add_parser("locust", help="headless Locust run and the upstream check")
    common(loc)
    loc.add_argument("--users", type=int, default=int(os.environ.get("STACK_USERS", "250")))
    loc.add_argument(
        "--user-rate",
        type=float,
        default=float(os.environ.get("STACK_USER_RATE", "2")),
        help="req/s per user (0: back to back)",
    )
    loc.add_argument("--window", type=float, default=60.0, help="measured seconds")
    loc.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    loc.add_argument("--workers", type=int, default=None, help="Locust worker processes")
    loc.add_argument("--csv", type=Path, default=None, help="CSV prefix (.stack/locust)")
    loc.add_argument("--min-share", type=float, default=0.95, help="of the combined limit")
    loc.add_argument("--no-check", action="store_true", help="exit 0 whatever the result")
    loc.set_defaults(func=_cmd_locust)

    plan = sub.add_parser("plan", help="print the local commands")
    common(plan)
    plan.set_defaults(func=_cmd_plan)

    args = parser.parse_args(argv)
    if args.func is None:
        parser.print_help()
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
