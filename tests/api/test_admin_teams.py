"""``/admin/teams`` through a real proxy (in this process, the in-memory stores) and the
real fake upstream, with the OpenAI SDK as the client: a created team is listed beside the
config's, limits the keys that name it at once (429 ``team_rpm``), changes take effect at
once and its budgets keep their spend across a change that leaves them; config teams are
read-only; a team its keys still name is not deleted; a key naming no team is refused;
every write is audited; the key manager shows the teams and offers them to keys."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.admin import sdk_chat
from support.proxy_server import ProxyInThread, settings_from

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ADMIN_KEY = "admin-secret-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CONFIG_KEY = "sk-config-research"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def config(upstream_url: str) -> dict[str, Any]:
    return {
        "admin": {"keys": ["another-admin-key", ADMIN_KEY]},
        "teams": [{"name": "research", "rpm": 100, "budgets": [{"usd": 5, "period": "week"}]}],
        "keys": [{"name": "config-key", "key": CONFIG_KEY, "team": "research"}],
        "models": [
            {"name": "gpt-4o-mini", "deployments": [{"id": "a", "base_url": upstream_url}]},
            {"name": "gpt-4o", "deployments": [{"id": "b", "base_url": upstream_url}]},
        ],
    }


@pytest.fixture
def proxy(upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(config(upstream.base_url))) as running:
        yield running


def admin(proxy: ProxyInThread) -> httpx.Client:
    return httpx.Client(base_url=f"{proxy.url}/admin", headers=ADMIN, timeout=10)


def chat(url: str, key: str, model: str = "gpt-4o-mini") -> tuple[int, str | None]:
    return sdk_chat(f"{url}/v1", key, model)


def _key(api: httpx.Client, name: str, **fields: Any) -> str:
    created = api.post("/keys", json={"name": name, **fields})
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


def test_a_created_team_is_listed_after_the_configs_and_read_by_name(
    proxy: ProxyInThread,
) -> None:
    entry = {"name": "squad", "rpm": 5, "max_parallel": 2}
    entry |= {"limits": [{"tokens": 1000, "per": "1h", "models": ["gpt-4o"]}]}
    entry |= {"budgets": [{"usd": 10, "period": "month"}]}
    with admin(proxy) as api:
        created = api.post("/teams", json=entry)
        assert created.status_code == 201, created.text
        assert {**entry, "source": "api"}.items() <= created.json().items()
        assert created.json()["created_at"].endswith("Z")
        listed = api.get("/teams").json()
        assert [(t["name"], t["source"]) for t in listed["teams"]] == [
            ("research", "config"),
            ("squad", "api"),
        ]
        assert (listed["page"], listed["pages"], listed["total"]) == (1, 1, 2)
        research = listed["teams"][0]
        assert research["rpm"] == 100 and research["budgets"] == [{"usd": 5.0, "period": "week"}]
        assert api.get("/teams/squad").json() == created.json()
        assert api.get("/teams/research").json() == research
        missing = api.get("/teams/nobody")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "team_not_found"
        again = api.post("/teams", json={"name": "squad"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "team_exists"


def test_config_teams_are_read_only(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        for call in (
            api.post("/teams", json={"name": "research", "rpm": 1}),
            api.patch("/teams/research", json={"rpm": 1}),
            api.delete("/teams/research"),
        ):
            assert call.status_code == 409, call.text
            assert call.json()["error"]["code"] == "config_team"
        assert api.get("/teams/research").json()["rpm"] == 100


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "t", "rpm": "many"}, "rpm"),
        ({"name": "t", "rpm": 0}, "rpm"),
        ({"name": "t", "limits": [{"requests": 1, "per": "1m", "models": ["gpt-5"]}]}, None),
        ({"name": "t", "budgets": [{"usd": 5, "period": "year"}]}, "budgets.0.period"),
        ({"name": "t", "budgets": [{"usd": 5, "period": "day", "models": ["x"]}]}, None),
        ({"name": "t", "colour": "red"}, "colour"),
        ({"name": "t", "team": "other"}, "team"),
        ({"name": "bad name/x"}, "name"),
        ({"rpm": 1}, "name"),
        (["not", "an", "object"], None),
    ],
)
def test_an_invalid_team_is_a_400_naming_the_field(
    proxy: ProxyInThread, body: Any, param: str | None
) -> None:
    with admin(proxy) as api:
        answer = api.post("/teams", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    elif isinstance(body, dict):  # a window's or a budget's unknown model group
        assert error["param"] in ("limits.0.models", "budgets.0.models"), error


def test_an_api_teams_windows_limit_its_keys_and_a_change_takes_effect_at_once(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        assert api.post("/teams", json={"name": "squad", "rpm": 3}).status_code == 201
        alice = _key(api, "alice", team="squad", rpm=10)
        bob = _key(api, "bob", team="squad")
        assert [chat(proxy.url, k)[0] for k in (alice, bob, alice)] == [200, 200, 200]
        assert chat(proxy.url, bob) == (429, "team_rpm")
        assert chat(proxy.url, alice) == (429, "team_rpm")
        assert chat(proxy.url, CONFIG_KEY) == (200, None)  # another team's key

        changed = api.patch("/teams/squad", json={"rpm": 1000})
        assert changed.status_code == 200, changed.text
        assert changed.json()["rpm"] == 1000 and changed.json()["source"] == "api"
        assert chat(proxy.url, bob) == (200, None)
        assert api.patch("/teams/squad", json={"rpm": -1}).status_code == 400
        assert api.patch("/teams/squad", json={"name": "other"}).status_code == 400
        assert api.patch("/teams/nobody", json={"rpm": 1}).status_code == 404
        # A null removes a field: no window left, the team limits nothing.
        removed = api.patch("/teams/squad", json={"rpm": None})
        assert removed.status_code == 200 and "rpm" not in removed.json()
        assert chat(proxy.url, bob) == (200, None)


def test_a_teams_budget_keeps_its_spend_across_a_change_that_leaves_it(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        team = {"name": "capped", "rpm": 100, "budgets": [{"requests": 3, "period": "day"}]}
        assert api.post("/teams", json=team).status_code == 201
        secret = _key(api, "capped-key", team="capped")
        assert [chat(proxy.url, secret)[0] for _ in range(2)] == [200, 200]
        assert api.patch("/teams/capped", json={"rpm": 200, "max_parallel": 4}).status_code == 200
        assert chat(proxy.url, secret) == (200, None)  # the third of the day's three
        assert chat(proxy.url, secret) == (429, "team_budget_requests_day")


def test_a_key_naming_no_team_is_refused_and_a_team_its_keys_name_is_not_deleted(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        refused = api.post("/keys", json={"name": "stray", "team": "squad"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "team"
        assert api.post("/teams", json={"name": "squad", "rpm": 100}).status_code == 201
        secret = _key(api, "member", team="squad")
        moved = _key(api, "moved", team="squad")
        in_use = api.delete("/teams/squad")
        assert in_use.status_code == 409, in_use.text
        assert in_use.json()["error"]["code"] == "team_in_use"
        assert "member" in in_use.json()["error"]["message"]
        assert "moved" in in_use.json()["error"]["message"]

        assert api.patch("/keys/moved", json={"team": "research"}).status_code == 200
        assert api.delete("/keys/member").status_code == 204
        assert api.delete("/teams/squad").status_code == 204
        again = api.delete("/teams/squad")
        assert again.status_code == 404 and again.json()["error"]["code"] == "team_deleted"
        assert [t["name"] for t in api.get("/teams").json()["teams"]] == ["research"]
        assert api.post("/keys", json={"name": "late", "team": "squad"}).status_code == 400
        assert chat(proxy.url, secret)[0] == 401
        assert chat(proxy.url, moved) == (200, None)


def test_api_teams_survive_a_reload(upstream: FakeUpstreamHandle, tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config(upstream.base_url)))
    settings = settings_from(config(upstream.base_url))
    with ProxyInThread(settings, config_path=path) as proxy, admin(proxy) as api:
        assert api.post("/teams", json={"name": "squad", "rpm": 1}).status_code == 201
        secret = _key(api, "member", team="squad")
        assert chat(proxy.url, secret) == (200, None)
        assert api.post("/reload").status_code == 200
        assert chat(proxy.url, secret) == (429, "team_rpm")  # the new catalog asks it too
        assert api.patch("/teams/squad", json={"rpm": 100}).status_code == 200
        assert chat(proxy.url, secret) == (200, None)
        assert [t["name"] for t in api.get("/teams").json()["teams"]] == ["research", "squad"]


def test_the_listing_is_paged_and_filtered_by_name_prefix(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        for i in range(5):
            assert api.post("/teams", json={"name": f"batch-{i}"}).status_code == 201
        first = api.get("/teams", params={"name_prefix": "batch-", "per_page": 2}).json()
        assert [t["name"] for t in first["teams"]] == ["batch-0", "batch-1"]
        assert (first["page"], first["pages"]) == (1, 3)
        last = api.get("/teams", params={"name_prefix": "batch-", "per_page": 2, "page": 3})
        assert [t["name"] for t in last.json()["teams"]] == ["batch-4"]
        second = api.get("/teams", params={"per_page": 2, "page": 1}).json()
        assert [t["name"] for t in second["teams"]] == ["research", "batch-0"]
        assert api.get("/teams", params={"page": "0"}).status_code == 400


def test_the_api_needs_an_admin_key(proxy: ProxyInThread) -> None:
    assert httpx.post(f"{proxy.url}/admin/teams", json={"name": "x"}).status_code == 401
    assert httpx.get(f"{proxy.url}/admin/teams").status_code == 401
    wrong = {"authorization": f"Bearer {CONFIG_KEY}"}
    assert httpx.delete(f"{proxy.url}/admin/teams/x", headers=wrong).status_code == 401


def test_every_write_is_audited(proxy: ProxyInThread, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.keys.audit"), admin(proxy) as api:
        api.post("/teams", json={"name": "audited", "rpm": 5})
        api.post("/teams", json={"name": "audited"})  # exists
        api.patch("/teams/audited", json={"rpm": 6})
        api.patch("/teams/research", json={"rpm": 6})  # a config team
        api.delete("/teams/audited")
        metrics = httpx.get(f"{proxy.url}/metrics").text
    lines = [r for r in caplog.records if r.getMessage() == "team operation"]
    seen = [(r.operation, r.team_name, r.who, r.result) for r in lines]  # type: ignore[attr-defined]
    assert seen == [
        ("team_create", "audited", "admin.keys[1]", "success"),
        ("team_create", "audited", "admin.keys[1]", "conflict"),
        ("team_update", "audited", "admin.keys[1]", "success"),
        ("team_update", "research", "admin.keys[1]", "conflict"),
        ("team_delete", "audited", "admin.keys[1]", "success"),
    ]
    assert 'llmproxy_key_operations_total{operation="team_create",result="success"} 1.0' in metrics
    assert 'llmproxy_key_operations_total{operation="team_update",result="conflict"} 1.0' in metrics
    assert 'llmproxy_key_operations_total{operation="team_delete",result="success"} 1.0' in metrics


def test_the_key_manager_shows_the_teams_and_offers_them_to_keys(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        team = {"name": "squad", "rpm": 7, "budgets": [{"usd": 3, "period": "day"}]}
        assert api.post("/teams", json=team).status_code == 201
        _key(api, "member", team="squad")
        page = api.get("/key-manager")
    assert page.status_code == 200
    html = page.text
    assert 'data-team="research"' in html and 'data-team="squad"' in html
    assert "rpm 7" in html and "usd 3/day" in html and "usd 5.0/week" in html
    for form in ("create", "edit", "rotate", "revoke", "team-create", "team-edit", "team-delete"):
        assert f'id="{form}"' in html, form
    # The key's forms offer every team; the team's forms, the API's only.
    assert '<select name="team" data-teams="all">' in html
    assert '<option value="research">research</option><option value="squad">' in html
    assert '<select name="target" data-teams="api"><option value="squad">' in html
    for name in ("limits", "budgets"):
        assert f'<textarea name="{name}"' in html
    assert 'name="expires_at" type="datetime-local"' in html
    assert "<td>member</td><td>api</td><td>squad</td>" in html
    assert "<link" not in html and "src=" not in html and "http" not in html.split("<script")[1]


def test_an_api_teams_windows_are_in_the_admin_state_as_a_config_teams_are(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        assert api.post("/teams", json={"name": "squad", "rpm": 3}).status_code == 201
        member = _key(api, "member", team="squad")
        assert chat(proxy.url, member)[0] == 200
        teams = {t["name"]: t for t in api.get("/state").json()["teams"]}
    assert list(teams) == ["research", "squad"]
    (window,) = teams["squad"]["windows"]
    assert window["limit"] == 3 and window["remaining"] < 3  # the request it counted
