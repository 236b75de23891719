"""The machine a benchmark ran on: hardware, versions, commit, and how busy others kept it."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
import threading
import time
from pathlib import Path

from loadtest.bench.model import Environment
from loadtest.bench.servers import CHILD_SESSIONS
from loadtest.topology import REPO

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
    "tensorzero",  # the peer gateway
)


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
        ours = {own_session, *(p for p in CHILD_SESSIONS)}
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
