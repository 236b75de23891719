"""No budget leaks: after upstream errors, timeouts and client disconnects, every parallel
slot is free again and the token budgets hold only what was really used."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from support.proxy_server import ProxyInThread, settings_from
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

KEY = "sk-leaks"
TPM = 1_000_000
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}

pytestmark = pytest.mark.usefixtures("serving_path")  # the fast and the portable paths


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, completion_tokens=5)) as handle:
        yield handle


async def _mixed_run(url: str, upstream: FakeUpstreamHandle) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=10, headers=headers) as client:
        post = lambda: client.post(f"{url}/chat/completions", json=BODY)  # noqa: E731
        await asyncio.gather(*(post() for _ in range(5)))  # plain successes
        for option in ("fail_rate", "drop_rate"):
            upstream.control(**{option: 1.0})
            await asyncio.gather(*(post() for _ in range(3)))
            upstream.control(**{option: 0.0})
        upstream.control(hang_rate=1.0)  # upstream timeouts (the deployment waits 0.5 s)
        await asyncio.gather(*(post() for _ in range(3)))
        upstream.control(hang_rate=0.0, stream_chunks=40, chunk_delay=0.05)
        for _ in range(3):  # clients that leave mid-stream
            body = {**BODY, "stream": True}
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                async for _ in response.aiter_raw():
                    break


@pytest.mark.slow
def test_errors_timeouts_and_disconnects_leak_no_budget(upstream: FakeUpstreamHandle) -> None:
    config = {
        "keys": [{"name": "k", "key": KEY, "rpm": 1000, "tpm": TPM, "max_parallel": 5}],
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "d", "base_url": upstream.base_url, "timeout": "0.5s", "tpm": TPM}
                ],
            }
        ],
        "routing": {"retries": 0, "cooldown": {"allowed_fails": 1000}},
    }
    with ProxyInThread(settings_from(config)) as proxy:
        asyncio.run(_mixed_run(proxy.base_url, upstream))
        pipeline = proxy.app.state.pipeline
        deadline_checks = 0
        while (
            pipeline.background._tasks or upstream.stats()["in_flight"]
        ) and deadline_checks < 100:
            asyncio.run(asyncio.sleep(0.05))
            deadline_checks += 1
        limiter = pipeline.limiter
        leases = limiter.leases_held("k")
        in_flight = dict(pipeline.dispatcher.in_flight)
        # A last request shows the key's token budget: only real usage was kept.
        final = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json={**BODY, "max_tokens": 5},
            headers={"authorization": f"Bearer {KEY}"},
        )
    assert leases == 0
    assert set(in_flight.values()) <= {0}
    assert final.status_code == 200
    used = TPM - int(final.headers["x-ratelimit-remaining-tokens"])
    # 5 successes and this one, each about 10 real tokens, plus this one's estimate; the
    # failed and timed-out calls (500 tokens reserved each) were refunded. (The streams
    # left mid-way are charged their estimate, never refunded: test_client_accounting.py;
    # at this TPM those 1,500 tokens have refilled by now.)
    assert used < 200, used


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_while_waiting_is_noticed_at_once(
    upstream: FakeUpstreamHandle, stream: bool
) -> None:
    """Six clients at once, one turn about every 0.5 s: the first goes now, the five
    others give up after 0.3 s on turns 0.5-2.5 s ahead. Nothing of theirs goes upstream, their
    turns go back (a later request gets a turn within max_wait, which their turns would
    have pushed past it), and their key's parallel slots and token estimates come back
    (or the later request would get key_parallel)."""
    config = {
        "keys": [{"name": "k", "key": KEY, "tpm": TPM, "max_parallel": 6}],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": upstream.base_url, "rpm": 120}]}
        ],
        "routing": {"retries": 0, "max_wait": "3s"},
    }
    body = {**BODY, "stream": stream}
    headers = {"authorization": f"Bearer {KEY}"}

    async def scenario(url: str) -> tuple[list[BaseException | httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(headers=headers, timeout=0.3) as impatient:
            left = await asyncio.gather(
                *(impatient.post(f"{url}/chat/completions", json=body) for _ in range(6)),
                return_exceptions=True,
            )
        async with httpx.AsyncClient(headers=headers, timeout=10) as patient:
            later = await patient.post(f"{url}/chat/completions", json={**body, "max_tokens": 5})
        return left, later

    with ProxyInThread(settings_from(config)) as proxy:
        pipeline = proxy.app.state.pipeline
        left, later = asyncio.run(scenario(proxy.base_url))
        # Their turns were up to 2.5 s away: had they waited on, they would hold their
        # slots still (the later request's own is released once its answer is out: by a
        # loop callback just after it, which may start a background task).
        proxy.settled()
        wait_until(lambda: not pipeline.background._tasks, what="bookkeeping done")
        leases = pipeline.limiter.leases_held("k")
        waiting = pipeline.dispatcher.waiting
    gave_up = [o for o in left if isinstance(o, httpx.TimeoutException)]
    assert len(gave_up) == 5, left  # the sixth went at once
    assert later.status_code == 200, later.text
    assert upstream.stats()["requests"] == 2  # the one that went at once and the later one
    assert waiting == 0 and leases == 0
    # The five estimates (500 tokens each) came back: two requests' worth is counted.
    assert TPM - int(later.headers["x-ratelimit-remaining-tokens"]) < 600
