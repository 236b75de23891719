"""The seed scenario of issue 55 ("Exact at full use"): ten naive clients at once
before an upstream that takes two requests a second.

One proxy process (the default in-memory limiter) in front of a strict fake upstream in
a process of its own, taking 2 requests in any sliding second (and telling nothing but
its 429s); the deployment is configured with its true limit, rpm 120. Ten requests are
sent at the same moment, from ten threads, each with the openai SDK and no retries (what
a naive client does). The proxy holds them and paces them to the upstream: every one is
answered 200 and the upstream rejects none (the yardstick: no upstream 429 caused by the
proxy). On a quiet host, and on a busy one (support/busy_host.py: two CPU-bound
processes beside the proxy on the 2-core host, from before the upstream and the proxy
start until the last answer). The figures are printed (``-s``): the time to serve all
ten, the most requests the upstream saw in one window, the margin the proxy paced with."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.busy_host import busy_host
from support.models import MODEL, strict_model
from support.proxy_server import ProxyProcess
from support.upstream_process import reset, stats, strict_upstream_process
from support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,  # real processes, seconds of pacing: `make test-fast` skips it
    pytest.mark.serial,  # measures the yardstick on a quiet host: run alone (Makefile)
]

LIMIT = 2  # the upstream's requests in any sliding WINDOW
WINDOW = 1.0  # seconds
CLIENTS = 10
ADMIN_KEY = "admin-secret-key"
CLIENT_KEY = "sk-seed"


def _ask(client: openai.OpenAI, start: threading.Barrier) -> int:
    """One chat completion once every client is ready: its status (0: no answer)."""
    start.wait()
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    except openai.APIStatusError as exc:
        return exc.status_code
    except openai.APIConnectionError:
        return 0
    return 200


def _all_at_once(base_url: str) -> tuple[list[int], float]:
    """CLIENTS requests sent at the same moment: their statuses, and the seconds from
    that moment until the last was answered."""
    clients = [
        openai.OpenAI(base_url=base_url, api_key=CLIENT_KEY, max_retries=0, timeout=60.0)
        for _ in range(CLIENTS)
    ]
    start = threading.Barrier(CLIENTS + 1)
    statuses: list[int] = []
    threads = [
        threading.Thread(target=lambda c=c: statuses.append(_ask(c, start)), daemon=True)
        for c in clients
    ]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(120)
    took = time.monotonic() - began
    for client in clients:
        client.close()
    return statuses, took


def _pacing(proxy: ProxyProcess) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    state = httpx.get(f"{proxy.url}/admin/state", headers=headers, timeout=10).json()
    pacing: dict[str, Any] = state["limiter"]["pacing"]
    return pacing


@pytest.mark.parametrize("host", ["quiet", "busy"])
def test_ten_naive_clients_at_once_are_all_served_and_the_upstream_rejects_none(
    tmp_path: Path, host: str
) -> None:
    """Ten requests at once, the upstream's true limit 2 a second configured as rpm 120:
    all ten answered 200 (held, then paced), and the upstream rejected none of what the
    proxy sent it, on a quiet host and with two CPU-bound processes beside the proxy
    (measured: 0 upstream 429s in every run of either; all ten served in ~4.8 s, the
    upstream's peak 2 in a window)."""
    with ExitStack() as stack:
        if host == "busy":  # from before the upstream and the proxy start
            stack.enter_context(busy_host(processes=2, seconds=60))
        upstream = stack.enter_context(
            strict_upstream_process(tmp_path, rpm=LIMIT, window=WINDOW, latency=0.02)
        )
        config: dict[str, Any] = {
            "models": strict_model(f"{upstream}/v1", rpm=int(LIMIT / WINDOW * 60)),
            "admin": {"keys": [ADMIN_KEY]},  # /admin/state: the margin in force
            "keys": [{"name": "seed", "key": CLIENT_KEY}],
        }
        proxy = stack.enter_context(ProxyProcess(config, tmp_path))
        reset(upstream)
        statuses, took = _all_at_once(proxy.base_url)
        end = stats(upstream)
        pacing = _pacing(proxy)
    print(
        f"\nseed, {host} host: {CLIENTS} at once, {sorted(statuses)}; all served in"
        f" {took:.2f} s; upstream saw {end['requests']}, rejected {end['rejected']}, peak"
        f" {end['peak_window_requests']} in a {WINDOW:g} s window; margin"
        f" {pacing['margin_seconds'] * 1000:.0f} ms, late turns not sent"
        f" {pacing['late_turns_not_sent']}, measured {pacing['measured']}"
    )
    assert statuses == [200] * CLIENTS, statuses
    assert end["rejected"] == 0, end  # no upstream 429 caused by the proxy
    assert end["peak_window_requests"] <= LIMIT, end


def test_a_busy_host_ends_on_its_own_after_its_seconds() -> None:
    """busy_host's processes spin while the block runs, and each ends by itself once its
    seconds are up (a test that dies does not leave the host busy)."""
    with busy_host(processes=2, seconds=1.0) as pids:
        assert len(pids) == 2
        assert all(_state(pid) == "R" for pid in pids)  # running: spinning, not waiting
        wait_until(lambda: all(_state(pid) in ("Z", None) for pid in pids), 20.0, "them to end")


def _state(pid: int) -> str | None:
    """The process's state letter (R running, Z exited, not yet reaped), None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
