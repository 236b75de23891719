"""The admin state, through real proxies, the real fake upstream and (for the shared view)
a real Redis: a cooling deployment and a waiting request show in ``GET /admin/state``
and on ``GET /admin``; both need an admin key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.admin import (
    ADMIN,
    ADMIN_KEY,
    config,
    cooling_and_waiting,
    deployment,
    key,
    poll_state,
    shows_cooling_and_waiting,
)
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread


@pytest.fixture
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def assert_cooling_and_waiting(view: dict[str, Any]) -> None:
    broken = deployment(view, "flaky", "broken")
    assert broken["health"]["state"] == "cooling"
    assert 0 < broken["health"]["cooldown_until"]["in"] <= 60
    assert broken["health"]["cooldown_until"]["at"].endswith("Z")
    assert broken["health"]["probe_in_progress"] is False
    assert broken["next_turn"]["in"] > 0  # not before its cooldown ends

    paced = deployment(view, "slow", "paced")
    assert paced["health"]["state"] == "healthy"
    assert paced["waiting"] == 1
    assert paced["in_flight"] == 0
    # Its minute's request and the waiting one's turn are taken: the next is a minute on.
    assert paced["next_turn"]["in"] > 30
    [rpm] = paced["windows"]
    assert (rpm["name"], rpm["configured"], rpm["remaining"]) == ("rpm", 1, 0)
    # Paced for turns up to the margin in force late (auto: measured, at most 100 ms).
    assert 1 / 1.1 - 1e-3 <= rpm["limit"] <= 0.99 + 1e-3

    team = key(view, "team-a")
    assert team["waiting"] == 1
    assert team["max_parallel"] == 5 and team["slots_held"] == 1  # the waiting request's
    windows = {w["name"]: w for w in team["windows"]}
    # A minute's 100 requests refill one every 0.6 s: on a loaded machine the three taken
    # are back before the state is read, so only the day's tokens show what was taken.
    assert windows["rpm"]["configured"] == 100 and windows["rpm"]["remaining"] <= 100
    # A day's tokens refill slowly: the waiting request's estimate is still taken.
    assert windows["tpd"]["configured"] == 1000000 and windows["tpd"]["remaining"] < 1000000

    assert next(m for m in view["models"] if m["name"] == "slow")["waiting"] == 1
    assert view["waiting"] == 1


def test_admin_state_shows_a_cooling_deployment_and_a_waiting_request(
    upstream: FakeUpstreamHandle,
) -> None:
    async def scenario(url: str) -> dict[str, Any]:
        async with cooling_and_waiting(url):
            return await poll_state(url, shows_cooling_and_waiting)

    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        view = asyncio.run(scenario(proxy.url))
    pacing = view["limiter"].pop("pacing")
    assert view["limiter"] == {"mode": "memory", "scope": "this process", "replicas_reporting": 1}
    assert pacing["mode"] == "auto" and pacing["set_here"], pacing  # its own: nothing shared
    assert_cooling_and_waiting(view)


def test_admin_state_with_redis_is_the_view_of_every_replica(
    upstream: FakeUpstreamHandle, redis_url: str
) -> None:
    """The request waits on one replica; another replica's admin state shows it (its
    heartbeat carries it), and the cooldown, which lives in Redis."""
    settings = settings_from(config(upstream.base_url, redis_url))

    def both_replicas(view: dict[str, Any]) -> bool:
        # At least these two: a replica of the test before on this worker's Redis may
        # still be counted until its heartbeat expires (a CI run saw 3).
        reporting = view["limiter"]["replicas_reporting"]
        return reporting >= 2 and shows_cooling_and_waiting(view)

    async def scenario(busy: str, other: str) -> dict[str, Any]:
        async with cooling_and_waiting(busy):
            return await poll_state(other, both_replicas)

    with ProxyInThread(settings) as busy, ProxyInThread(settings) as other:
        view = asyncio.run(scenario(busy.url, other.url))
    assert view["limiter"]["mode"] == "shared"
    assert view["limiter"]["scope"] == "all replicas"
    assert_cooling_and_waiting(view)


def test_the_admin_page_renders_the_state(upstream: FakeUpstreamHandle) -> None:
    async def scenario(url: str) -> httpx.Response:
        async with cooling_and_waiting(url):
            await poll_state(url, shows_cooling_and_waiting)
            async with httpx.AsyncClient(timeout=5) as client:
                return await client.get(f"{url}/admin", headers=ADMIN)

    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        page = asyncio.run(scenario(proxy.url))
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    html = page.text
    assert '<meta http-equiv="refresh"' in html
    assert 'data-deployment="broken" data-health="cooling"' in html
    assert "<script" not in html and "http://" not in html and "https://" not in html


@pytest.mark.parametrize("path", ["/admin", "/admin/state", "/admin/spend", "/admin?view=spend"])
def test_the_admin_endpoints_need_the_admin_key(upstream: FakeUpstreamHandle, path: str) -> None:
    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        for headers in ({}, {"authorization": "Bearer sk-team-a"}, {"authorization": ADMIN_KEY}):
            reply = httpx.get(f"{proxy.url}{path}", headers=headers)
            assert reply.status_code == 401, headers
            assert reply.json()["error"]["code"] == "invalid_admin_key"
        assert httpx.get(f"{proxy.url}{path}", headers=ADMIN).status_code == 200


@pytest.mark.parametrize("path", ["/admin", "/admin/state"])
def test_the_admin_endpoints_are_off_without_an_admin_key(
    upstream: FakeUpstreamHandle, path: str
) -> None:
    data = config(upstream.base_url)
    del data["admin"]
    with ProxyInThread(settings_from(data)) as proxy:
        reply = httpx.get(f"{proxy.url}{path}", headers=ADMIN)
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "unknown_url"


def test_a_browser_is_asked_for_the_admin_key_and_may_give_it_as_a_password(
    upstream: FakeUpstreamHandle,
) -> None:
    """A plain browser cannot send a bearer token: the page's 401 asks for Basic
    credentials (its login prompt), whose password is the admin key. The spend report,
    which the page's spend view links to, takes them too; the rest of the JSON API and
    the reload keep to bearer tokens."""
    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        refused = httpx.get(f"{proxy.url}/admin")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith('Basic realm="llm-proxy admin"')
        secret = ADMIN["authorization"].removeprefix("Bearer ")
        assert httpx.get(f"{proxy.url}/admin", auth=("admin", secret)).status_code == 200
        assert httpx.get(f"{proxy.url}/admin", auth=("admin", "wrong")).status_code == 401
        state = httpx.get(f"{proxy.url}/admin/state", auth=("admin", secret))
        assert state.status_code == 401
        assert "www-authenticate" not in state.headers
        assert httpx.get(f"{proxy.url}/admin/spend", auth=("admin", secret)).status_code == 200
        spend = httpx.get(f"{proxy.url}/admin/spend", auth=("admin", "wrong"))
        assert spend.status_code == 401
        assert spend.headers["www-authenticate"].startswith('Basic realm="llm-proxy admin"')
        view = httpx.get(f"{proxy.url}/admin?view=spend", auth=("admin", secret))
        assert view.status_code == 200 and "<h1>Spend</h1>" in view.text


def test_a_request_deferred_by_fair_share_waits_on_its_model_without_a_turn(
    upstream: FakeUpstreamHandle,
) -> None:
    """With fair share's lookahead (the default), a turn a minute ahead is not taken: the
    request waits on its model and key, and the deployment has no turn promised."""

    def deferred(view: dict[str, Any]) -> bool:
        slow = next(m for m in view["models"] if m["name"] == "slow")
        return slow["waiting"] == 1 and key(view, "team-a")["waiting"] == 1

    async def scenario(url: str) -> dict[str, Any]:
        async with cooling_and_waiting(url):
            return await poll_state(url, deferred)

    with ProxyInThread(settings_from(config(upstream.base_url, lookahead="500ms"))) as proxy:
        view = asyncio.run(scenario(proxy.url))
    paced = deployment(view, "slow", "paced")
    assert paced["waiting"] == 0
    [rpm] = paced["windows"]
    assert rpm["remaining"] < 1  # only the first request's turn is spent
