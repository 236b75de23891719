"""Replicas of the proxy on one Redis: ``llm-proxy serve`` processes on ports of their
own, started one after the other on the same config, and what they cost."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.servers import Processes, rss_mb, serve_config, worker_pids
from loadtest.topology import REPO


@dataclass(frozen=True)
class Replica:
    process: subprocess.Popen[bytes]
    url: str
    ready_s: float

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def rss_mb(self) -> float:
        """The serving processes' resident memory (the workers', or the process's)."""
        return sum(rss_mb(pid) for pid in (worker_pids(self.process.pid) or [self.process.pid]))


def start_replicas(
    procs: Processes,
    name: str,
    settings: dict[str, object],
    count: int,
    source: Path = REPO,
    ready_timeout: float = 60.0,
    extra_env: dict[str, str] | None = None,
) -> list[Replica]:
    """``count`` replicas of one worker each on ``settings``, all ready."""
    started: list[Replica] = []
    try:
        for i in range(count):
            process, url, ready_s = serve_config(
                procs, f"{name}-{i + 1}", settings, 1, source, ready_timeout, extra_env
            )
            started.append(Replica(process, url, ready_s))
    except BaseException:
        stop_replicas(procs, started)
        raise
    return started


def stop_replicas(procs: Processes, replicas: list[Replica]) -> None:
    for replica in replicas:
        procs.stop(replica.process)
