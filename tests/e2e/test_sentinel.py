"""A Sentinel-managed primary killed under load through two proxy replicas.

A primary, one replica and three sentinels on loopback (``sentinel_group``); two proxy
processes configured with ``redis.sentinel``; the fake upstream counts what reaches it in
a sliding window (a strict one also refuses what goes past its limit). While no primary
exists the replicas limit with their local shares (``on_error: local``) or answer 503
(``reject``); once the sentinels have promoted the replica, every replica shares budgets
on the new primary again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.load import LoadResult, drive
from support.models import LIMIT, RATE, STRICT_RPM, WINDOW, strict_model
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import SENTINEL_MASTER, SentinelGroup, redis_available
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.limiter.redis.backend import KEY_PREFIX

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
    pytest.mark.slow,  # bounded load for many seconds: `make test-fast` skips it
]

REPLICAS = 2
RESUMES_WITHIN = 30.0  # generous: the sentinels' failover (about 2 s here) plus a second


def _config(group: SentinelGroup, upstream: FakeUpstreamHandle, on_error: str) -> dict[str, Any]:
    return {
        "redis": {
            "sentinel": {"master": SENTINEL_MASTER, "nodes": group.nodes},
            "on_error": on_error,
            # A slow call is an outage too: on this busy test machine (tests run in
            # parallel) 100 ms timed out calls to a healthy primary.
            "timeout": "1s",
        },
        "models": strict_model(upstream.base_url, rpm=STRICT_RPM),
        "routing": {"max_wait": "2s", "retries": 0},
    }


def _shared(proxy: ProxyProcess) -> bool:
    state = httpx.get(f"{proxy.url}/health/ready", timeout=2).json()
    return bool(state.get("limiter") == "shared")


def _replicas_on_new_primary(group: SentinelGroup) -> int:
    """How many proxy replicas heartbeat on the primary the sentinels name now."""
    port = group.master_port()
    if port is None or port == group.primary.port:
        return 0
    with group.server_on(port).client() as c:
        return int(c.zcard(f"{KEY_PREFIX}:replicas"))


class _Failover(threading.Thread):
    """Measures (for docs/benchmarks.md; asserted nowhere: timings flake on this machine)
    how long after the primary's kill the sentinels named a new primary, and when every
    replica, having fallen back, limited in shared mode again."""

    def __init__(self, group: SentinelGroup, proxies: list[ProxyProcess]) -> None:
        super().__init__(daemon=True)
        self.group, self.proxies = group, proxies
        self.killed = time.monotonic()
        self.promoted: float | None = None
        self.shared_again: float | None = None

    def run(self) -> None:
        old, fell_back = self.group.primary.port, False
        deadline = self.killed + RESUMES_WITHIN
        while time.monotonic() < deadline and self.shared_again is None:
            now = time.monotonic() - self.killed
            if self.promoted is None and self.group.master_port() not in (None, old):
                self.promoted = now
            try:
                shared = all(_shared(p) for p in self.proxies)
            except httpx.HTTPError:
                shared = False
            fell_back |= not shared
            if fell_back and shared and self.promoted is not None:
                self.shared_again = now
            time.sleep(0.05)

    def report(self) -> str:
        promoted, shared = self.promoted, self.shared_again
        if promoted is None or shared is None:
            return f"new primary named at {promoted}, shared again at {shared} (s after the kill)"
        return (
            f"new primary named {promoted:.2f} s after the kill, every replica shared again"
            f" {shared:.2f} s after it ({shared - promoted:.2f} s after the promotion)"
        )


def _run(
    tmp_path: Path,
    group: SentinelGroup,
    on_error: str,
    upstream_config: FakeUpstreamConfig | None = None,
    demand: float = 3 * RATE,
    duration: float = 20.0,
) -> tuple[LoadResult, dict[str, Any]]:
    """The load (``demand`` a second for ``duration`` seconds) through both replicas, the
    primary killed 5 s in; what the upstream (by default one counting in a sliding
    window, refusing nothing) counted by the load's end, with its peak in a window over
    the short run after the failover too. Every request the load sent has its outcome;
    once both replicas share the new primary, that run gets only 200 or 429 and adds no
    upstream 429."""
    upstream_config = upstream_config or FakeUpstreamConfig(port=0, window=WINDOW)
    with ExitStack() as stack:
        upstream = stack.enter_context(run_in_thread(upstream_config))
        config = _config(group, upstream, on_error)
        proxies = start_together(
            stack,
            [ProxyProcess(config, tmp_path, name=f"replica-{i}") for i in range(REPLICAS)],
        )
        urls = [p.base_url for p in proxies]
        upstream.reset()

        async def scenario() -> LoadResult:
            load = asyncio.create_task(drive(urls, demand, duration))
            await asyncio.sleep(5.0)
            await asyncio.to_thread(group.primary.kill)
            failover.append(_Failover(group, proxies))
            failover[0].start()
            return await load

        failover: list[_Failover] = []

        result = asyncio.run(scenario())
        stats = upstream.stats()
        # Shared limiting resumes on the new primary: both replicas left their fallback
        # and heartbeat there (bounded by a generous deadline, not timed).
        wait_until(lambda: all(_shared(p) for p in proxies), RESUMES_WITHIN, "shared again")
        wait_until(
            lambda: _replicas_on_new_primary(group) == REPLICAS, RESUMES_WITHIN, "new primary"
        )
        after = asyncio.run(drive(urls, demand, 3.0))
        final = upstream.stats()
        failover[0].join(RESUMES_WITHIN)
        print(f"\nfailover, on_error {on_error}: {failover[0].report()}")
    assert set(after.statuses) <= {200, 429}, after.statuses
    assert final["rejected"] == stats["rejected"], (stats, final)
    assert len(result.outcomes) == result.sent, "a request was lost"
    return result, {**stats, "peak_window_requests": final["peak_window_requests"]}


def test_primary_killed_under_load_local_shares_then_the_new_primary(
    tmp_path: Path, sentinel_group: SentinelGroup
) -> None:
    result, stats = _run(tmp_path, sentinel_group, "local")
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes, stats)
    # docs/limiter.md's bound for a failover: the limit, one more replica's share while
    # the replicas switch, and one request per replica at the switch (replication on
    # loopback lags by far less than one turn).
    assert stats["peak_window_requests"] <= LIMIT + LIMIT / REPLICAS + REPLICAS, stats
    assert stats["served"] >= 0.8 * RATE * 20.0, stats


@pytest.mark.serial  # 0 upstream 429s of a sliding second: the yardstick, on a quiet host
def test_primary_killed_under_overload_against_a_strict_upstream_overshoots_nothing(
    tmp_path: Path, sentinel_group: SentinelGroup
) -> None:
    """Demand twice the limit of an upstream refusing past it (a sliding second, no
    rate-limit headers: it tells nothing but its 429s), the deployment stating that
    limit, ``on_error: local``; the primary killed 5 s in. Zero upstream 429s (the local
    shares hold past the last shared turn seen, the new primary gets the local turns
    carried over: limiter/policy.py), clients get only 200 or 429, and at least 90% of
    the limit is used over the span the upstream admitted requests (issue 55).

    The failover costs about two seconds of turns whatever the run's length: the local
    shares start OUTAGE_MARGIN (0.5 s) after the last shared turn seen, and the new
    primary's windows are held past each replica's last local turn by reset_after plus
    that margin (1.5 s; the other replica, still in its fallback, takes its half share
    meanwhile). Over a 20 s run that is ~9% of the limit (measured 89.6%, twice); the
    load runs 30 s, as the Redis outages' in tests/e2e/test_learning.py do."""
    strict = FakeUpstreamConfig(
        port=0, rpm=int(RATE), window=1.0, latency=0.02, ratelimit_headers=False
    )
    result, stats = _run(tmp_path, sentinel_group, "local", strict, demand=2 * RATE, duration=30.0)
    served, rejected, span = stats["served"], stats["rejected"], stats["admitted_span"]
    print(
        f"\nfailover, strict upstream (1 s window), 2x overload: served {served},"
        f" {served / (RATE * span):.1%} of the limit over {span:.1f} s; upstream 429s"
        f" {rejected}; clients: {dict(result.statuses)} {dict(result.codes)}"
    )
    assert rejected == 0, stats
    assert set(result.statuses) <= {200, 429}, (result.statuses, result.codes, stats)
    assert all(o.retry_after for o in result.outcomes if o.status == 429)
    assert served >= 0.9 * RATE * span, stats


def test_primary_killed_with_reject_answers_503_only_while_no_primary_exists(
    tmp_path: Path, sentinel_group: SentinelGroup
) -> None:
    result, stats = _run(tmp_path, sentinel_group, "reject")
    assert set(result.statuses) <= {200, 429, 503}, (result.statuses, result.codes)
    assert {o.code for o in result.outcomes if o.status == 503} <= {"limiter_unavailable"}
    refused = [o for o in result.outcomes if o.status == 503]
    # 503s only once the primary is gone (killed 5 s in); after the failover none (the
    # run after it, in _run, gets only 200 and 429).
    assert all(o.done_at >= 4.5 for o in refused), refused[:3]
    assert result.count(200) > 0 and stats["peak_window_requests"] <= LIMIT + REPLICAS
