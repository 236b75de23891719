"""Pacing exact when a replica is late: proxy processes share one Redis (two replicas)
or a 3-master Redis Cluster (three) in front of an upstream enforcing a strict sliding
window of one second (10 requests in any second, to the millisecond), and one replica's
event loop is stalled again and again, up to 50 ms at a time
(support/stalled_proxy.py), as on a machine shared with other work.

A turn that replica sends late comes closer to the turns after it, sent on time by the
other; the deployments' pacing margin (``routing.pacing_margin``, docs/limiter.md) must
absorb it: the upstream rejects nothing, and at least 90% of its limit is used."""

from __future__ import annotations

import asyncio
import re
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.load import drive
from support.models import strict_model
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisClusterServers, RedisServer, redis_available
from support.stalled_proxy import STALLED

from proxy.fake_upstream import FakeUpstreamConfig, run_in_thread

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
    pytest.mark.slow,  # bounded load for many seconds: `make test-fast` skips it
]

WINDOW = 1.0  # the upstream's sliding window, seconds
LIMIT = 10  # requests it takes in any window
RATE = LIMIT / WINDOW
# 10 s of load at twice the limit: 10 windows of the upstream's 1 s, and the queue drains
# for up to max_wait (3 s) after it. The accuracy checked is a rate over the span the
# upstream admitted requests (~12.8 s, ~120 served), so a shorter run keeps its margin:
# measured 95.0-95.1% against the 90% asserted, as at 20 s (the fencepost, n requests over
# n - 1 intervals, adds 0.8% here, 0.5% at 20 s). It still stalls the replica ~100 times
# and wakes ~45 of its turns under those stalls (some 40-50 ms late), half of 20 s's.
DURATION = 10.0
STALL_MS = 50
# How late a turn may be with no upstream window of 1 s seeing 11: the pacing margin
# (50 ms) and the 1% kept for the network (10 ms of a second).
TOLERATED_MS = 60


@pytest.mark.parametrize(("storage", "replicas"), [("redis", 2), ("cluster", 3)])
def test_a_replica_whose_loop_stalls_up_to_50ms_overshoots_nothing(
    tmp_path: Path, storage: str, replicas: int
) -> None:
    """Demand twice the limit, split over the replicas; one replica's loop stalls for up
    to 50 ms every 100 ms on average. 0 upstream 429s; >= 90% of the limit used over the
    span the upstream admitted requests; clients get only 200 or 429 with retry-after.
    (With the 1% headroom alone, pacing_margin 0: 2 upstream 429s in each.)

    The guarantee holds for turns up to TOLERATED_MS late. This machine, shared with
    other work, can make a replica later than that on its own (once 70 ms, a replica the
    test did not stall): every wake-up measured beyond it may account for one upstream
    429, and is printed; none beyond, none is allowed."""
    upstream_config = FakeUpstreamConfig(
        port=0, rpm=LIMIT, window=WINDOW, latency=0.02, ratelimit_headers=False
    )
    with run_in_thread(upstream_config) as upstream, ExitStack() as stack:
        if storage == "cluster":
            cluster = RedisClusterServers(tmp_path / "cluster", masters=3).start()
            stack.callback(cluster.stop)
            url = cluster.url
        else:
            url = stack.enter_context(RedisServer(tmp_path / "redis")).url
        config = {
            "redis": {"url": url},
            # rpm: the true limit, stated
            "models": strict_model(upstream.base_url, rpm=int(RATE * 60)),
            "routing": {"max_wait": "3s", "retries": 0},
        }
        stalled = ProxyProcess(
            config,
            tmp_path,
            name="stalled",
            module=STALLED,
            env={
                "STALL_MAX_MS": str(STALL_MS),
                "STALL_EVERY_MS": "100",
                "STALL_BEYOND_MS": str(TOLERATED_MS),
            },
        )
        on_time = [  # through the same wrapper, not stalled: their wake-ups are measured
            ProxyProcess(
                config,
                tmp_path,
                name=f"on-time-{i}",
                module=STALLED,
                env={"STALL_MAX_MS": "0", "STALL_BEYOND_MS": str(TOLERATED_MS)},
            )
            for i in range(replicas - 1)
        ]
        proxies = start_together(stack, [stalled, *on_time])
        upstream.reset()
        result = asyncio.run(drive([p.base_url for p in proxies], 2 * RATE, DURATION))
        stats = upstream.stats()
    logs = stalled.logs()
    woke = [p.logs().strip().splitlines()[-1] for p in on_time]
    beyond = sum(int(n) for p in proxies for n in re.findall(r"(\d+) beyond", p.logs()))
    served, span = stats["served"], stats["admitted_span"]
    print(
        f"\n{storage}, one of {replicas} replicas stalled up to {STALL_MS} ms: served {served},"
        f" {served / (RATE * span):.1%} of the limit over {span:.1f} s; upstream 429s"
        f" {stats['rejected']}, peak {stats['peak_window_requests']} in a window; clients:"
        f" {dict(result.statuses)} {dict(result.codes)}; stalled replica:"
        f" {'; '.join(logs.strip().splitlines()[-2:])}; on time: {woke};"
        f" turns woken beyond {TOLERATED_MS} ms: {beyond}"
    )
    assert "stalled the loop" in logs, logs[-2000:]  # the stalls did happen
    assert len(result.outcomes) == result.sent, "a request was lost"
    assert stats["rejected"] <= beyond, (stats, beyond)  # 0 unless a turn was too late
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes)
    assert all(o.retry_after for o in result.outcomes if o.status == 429)
    assert served >= 0.9 * RATE * span, stats
