"""loadtest/cost.py measures the pipeline it means to: every request answered 200, in
process and, with the real-traffic mix, by a real worker."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from loadtest import cost
from loadtest.bench import traffic
from loadtest.bench.servers import servers
from loadtest.topology import LOOPBACK, REPO, free_port


@pytest.mark.parametrize("mode", cost.MODES)
async def test_the_measured_requests_are_served(mode: str) -> None:
    assert await cost._requests(mode, count=3, warmup=2) > 0


def test_the_real_mix_is_served_by_a_real_worker_on_its_three_apis(tmp_path: Path) -> None:
    """``--server --mix real`` without valgrind: the row's config on a private Redis,
    every request of the drawn sequence answered 200 (Client stops at another status);
    the sequence covers the three APIs, streamed and not."""
    drawn = cost.real_requests()
    sample = [drawn() for _ in range(200)]
    apis = {(path, b'"stream": true' in body) for path, _, body in sample}
    assert apis == {(p, s) for p in traffic.PATHS.values() for s in (False, True)}
    assert [r[2] for r in sample[:20]] == [r[2] for r in _first(cost.real_requests(), 20)]

    with servers(tmp_path) as (procs, upstream, redis):
        path = cost.served_config(str(tmp_path), upstream, redis, "redis", "real")
        port = free_port()
        serve = ["serve", "--config", path, "--host", LOOPBACK, "--port", str(port)]
        proxy = procs.start("proxy", [sys.executable, "-m", "proxy", *serve], REPO)
        cost.wait_live(proxy, port, lambda: procs.log("proxy"))
        with cost.Client(port, cost.real_requests()) as client:
            client.send(60)


def _first(requests: Callable[[], cost.Request], n: int) -> list[cost.Request]:
    return [requests() for _ in range(n)]
