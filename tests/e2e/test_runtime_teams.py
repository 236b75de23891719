"""Teams of the admin API across real replicas: two ``llm-proxy serve`` processes on a
redis-server this test starts, in front of the real fake upstream, the OpenAI SDK as the
client. A team created on A is listed on B, and its keys are limited by it there, within
a second; two keys of it, one on each replica, reach its rpm together: 429 ``team_rpm``;
a change on B is in force on A within a second; config teams are read-only on both; a
team its keys name is not deleted, and deleted it is gone everywhere; a store wiped
(FLUSHALL) is filled again, its teams listed and enforced as before."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.admin import sdk_chat
from support.proxy_server import ProxyProcess, start_together
from support.redis_server import RedisServer, redis_available
from support.waiting import wait_until

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.keys.redis_backend import key_names

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")

ADMIN = {"authorization": "Bearer admin-secret-key"}
PROPAGATION = 1.0  # the promise: every replica within a second
MODEL = "gpt-4o-mini"
TEAM_RECORDS = key_names("apiteams")[0]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def _config(upstream: FakeUpstreamHandle, redis_url: str) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url},
        "admin": {"keys": ["admin-secret-key"]},
        "teams": [{"name": "research", "rpm": 100}],
        "keys": [{"name": "config-key", "key": "sk-config-key", "team": "research"}],
        "models": [{"name": MODEL, "deployments": [{"id": "a", "base_url": upstream.base_url}]}],
        "routing": {"retries": 0},
    }


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def replicas(
    upstream: FakeUpstreamHandle, redis: RedisServer, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    with ExitStack() as stack:
        config = _config(upstream, redis.url)
        a, b = start_together(stack, [ProxyProcess(config, tmp_path, name=name) for name in "ab"])
        yield a, b


def _chat(proxy: ProxyProcess, secret: str) -> tuple[int, str | None]:
    return sdk_chat(proxy.base_url, secret, MODEL)


def _admin(proxy: ProxyProcess, method: str, path: str, body: object = None) -> httpx.Response:
    return httpx.request(method, f"{proxy.url}/admin{path}", headers=ADMIN, json=body, timeout=10)


def _teams(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    listed = _admin(proxy, "GET", "/teams")
    assert listed.status_code == 200, listed.text
    return {t["name"]: t for t in listed.json()["teams"]}


def _team_store(proxy: ProxyProcess) -> dict[str, Any]:
    return dict(_admin(proxy, "GET", "/state").json()["team_store"])


def _within(seconds: float, condition: Callable[[], bool], what: str) -> None:
    """``condition`` holds within ``seconds`` (polled; bounded)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"


def _key(proxy: ProxyProcess, name: str, **fields: Any) -> str:
    created = _admin(proxy, "POST", "/keys", {"name": name, **fields})
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


def test_a_team_created_on_one_replica_limits_its_keys_on_both(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    a, b = replicas
    created = _admin(a, "POST", "/teams", {"name": "squad", "rpm": 3})
    assert created.status_code == 201, created.text
    _within(PROPAGATION, lambda: "squad" in _teams(b), "the team listed on b")
    assert _teams(b)["squad"]["source"] == "api" and _teams(b)["research"]["source"] == "config"
    # Keys naming it, made on either replica (b knows the team: it checks the name).
    alice = _key(a, "alice", team="squad")
    bob = _key(b, "bob", team="squad")
    _within(PROPAGATION, lambda: _chat(b, alice)[0] == 200, "alice on b")
    _within(PROPAGATION, lambda: _chat(a, bob)[0] == 200, "bob on a")
    # Two requests so far, of 3 a minute: the third passes, then the team's rpm answers,
    # to either key on either replica. (A minute's window refills one request every
    # 20 s: the fourth is refused unless the machine took that long.)
    answers = [_chat(a, alice), _chat(b, bob), _chat(a, bob), _chat(b, alice)]
    assert answers[0] == (200, None), answers
    refused = [answer for answer in answers if answer[0] != 200]
    assert refused and set(refused) == {(429, "team_rpm")}, answers
    assert _chat(b, "sk-config-key") == (200, None)  # the config team's key: its own team

    # Changed on b: in force on a within a second.
    changed = _admin(b, "PATCH", "/teams/squad", {"rpm": 1000})
    assert changed.status_code == 200 and changed.json()["rpm"] == 1000, changed.text
    _within(PROPAGATION, lambda: _chat(a, alice)[0] == 200, "the new rpm on a")
    assert _teams(a)["squad"]["rpm"] == 1000


def test_config_teams_are_read_only_on_every_replica(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    for proxy in replicas:
        for method, path, body in (
            ("POST", "/teams", {"name": "research"}),
            ("PATCH", "/teams/research", {"rpm": 1}),
            ("DELETE", "/teams/research", None),
        ):
            answer = _admin(proxy, method, path, body)
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"]["code"] == "config_team"


def test_a_team_is_deleted_once_its_keys_are_gone_and_then_everywhere(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    a, b = replicas
    assert _admin(a, "POST", "/teams", {"name": "squad", "rpm": 50}).status_code == 201
    secret = _key(a, "member", team="squad")
    # b has not necessarily seen the key yet: its delete reads the keys first.
    in_use = _admin(b, "DELETE", "/teams/squad")
    assert in_use.status_code == 409, in_use.text
    assert in_use.json()["error"]["code"] == "team_in_use"
    assert "member" in in_use.json()["error"]["message"]

    assert _admin(b, "DELETE", "/keys/member").status_code == 204
    assert _admin(b, "DELETE", "/teams/squad").status_code == 204
    _within(PROPAGATION, lambda: "squad" not in _teams(a), "the team gone from a")
    refused = _admin(a, "POST", "/keys", {"name": "late", "team": "squad"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "team"
    # The keys' store is polled apart from the teams': the key's revocation reaches a
    # within its own second.
    _within(PROPAGATION, lambda: _chat(a, secret)[0] == 401, "the key revoked on a")


def test_a_wiped_store_is_filled_again_with_its_teams_still_enforced(
    replicas: tuple[ProxyProcess, ProxyProcess], redis: RedisServer
) -> None:
    a, b = replicas
    team = {"name": "squad", "rpd": 2, "budgets": [{"requests": 100, "period": "day"}]}
    assert _admin(a, "POST", "/teams", team).status_code == 201
    secret = _key(a, "member", team="squad")
    _within(PROPAGATION, lambda: _chat(b, secret)[0] == 200, "member on b")

    with redis.client() as client:
        client.flushall()  # the keys, the teams, the windows: all gone
        wait_until(lambda: client.hexists(TEAM_RECORDS, "squad"), 10, "squad written back")
    # Every replica sees the loss (an error line, the metric, /admin/state's team_store):
    # each had read the team before it served the key naming it (RuntimeTeams.cover).
    wait_until(
        lambda: all(_team_store(p)["losses_detected"] >= 1 for p in (a, b)), 10, "the loss seen"
    )
    for proxy in (a, b):
        wait_until(lambda p=proxy: _team_store(p)["state"] == "current", 10, "the store read")
        assert _team_store(proxy)["backend"] == "redis"
        assert _teams(proxy)["squad"]["rpd"] == 2
    # Enforced as before: the wiped windows start again at 2 a day.
    assert _chat(a, secret) == (200, None)
    assert _chat(b, secret) == (200, None)
    assert _chat(a, secret) == (429, "team_rpd")
    assert _chat(b, secret) == (429, "team_rpd")


def test_a_keys_team_windows_budgets_and_expiry_set_on_one_replica_hold_on_the_other(
    replicas: tuple[ProxyProcess, ProxyProcess],
) -> None:
    """The key manager's fields, through the API its forms call: a key made on a with an
    API team, a window of its own, a budget and an expiry is listed with them on b and
    limited by them there; the window and the budget are shared (each replica's
    requests count on the other's); an expiry changed on b to a past moment makes a
    refuse the key within a second."""
    a, b = replicas
    assert _admin(a, "POST", "/teams", {"name": "squad", "rpm": 1000}).status_code == 201
    windowed = _key(
        a,
        "windowed",
        team="squad",
        limits=[{"requests": 3, "per": "1h"}],
        expires_at="2030-01-15T12:00:00Z",
    )
    budgeted = _key(a, "budgeted", team="squad", budgets=[{"tokens": 200, "period": "day"}])
    _within(PROPAGATION, lambda: _chat(b, windowed)[0] == 200, "windowed on b")
    _within(PROPAGATION, lambda: _chat(b, budgeted)[0] == 200, "budgeted on b")
    listed = {k["name"]: k for k in _admin(b, "GET", "/keys").json()["keys"]}
    assert listed["windowed"]["team"] == "squad"
    assert listed["windowed"]["limits"] == [{"requests": 3, "per": "1h"}]
    assert listed["windowed"]["expires_at"].startswith("2030-01-15T12:00:00")
    assert listed["budgeted"]["budgets"] == [{"tokens": 200, "period": "day"}]

    # Its own window of 3 an hour: one used on b, one on a, one on b, then refused on both.
    assert [_chat(a, windowed), _chat(b, windowed)] == [(200, None)] * 2
    assert _chat(a, windowed) == (429, "key_requests_1h")
    assert _chat(b, windowed) == (429, "key_requests_1h")

    # The budget: spent by both replicas' requests, then refused on both.
    answers = [_chat(proxy, budgeted) for proxy in (a, b) * 10]
    first_refused = next(i for i, answer in enumerate(answers) if answer[0] != 200)
    assert first_refused >= 2, answers  # at least one on each replica
    assert set(answers[first_refused:]) == {(429, "key_budget_tokens_day")}, answers

    # Expired from b: a refuses it within a second.
    past = {"expires_at": "2001-01-01T00:00:00Z"}
    assert _admin(b, "PATCH", "/keys/windowed", past).status_code == 200
    _within(PROPAGATION, lambda: _chat(a, windowed) == (401, "expired_api_key"), "expired on a")
