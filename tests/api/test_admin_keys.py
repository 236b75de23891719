"""``/admin/keys`` through a real proxy (in this process, the in-memory key store) and the
real fake upstream, with the OpenAI SDK as the client: a created key answers at once, with
its limits, allow-list and priority; revoked, 401; rotated, the old secret works for its
grace only; expired, 401; config keys are listed and cannot be changed; an API key in a
team shares its windows with the team's config keys; ``budgets`` apply at once; every
operation is a log line and a metric, never the secret."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from support.proxy_server import ProxyInThread, settings_from
from support.redis_server import SENTINEL_MASTER, SentinelGroup, redis_available

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread
from proxy.keys.redis_backend import RECORDS

ADMIN_KEY = "admin-secret-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CONFIG_KEY = "sk-config-team"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def config(upstream_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "admin": {"keys": ["another-admin-key", ADMIN_KEY]},
        "keys": [{"name": "config-team", "key": CONFIG_KEY, "rpm": 100}],
        "models": [
            {"name": "gpt-4o-mini", "deployments": [{"id": "a", "base_url": upstream_url}]},
            {"name": "gpt-4o", "deployments": [{"id": "b", "base_url": upstream_url}]},
        ],
        **extra,
    }


@pytest.fixture
def proxy(upstream: FakeUpstreamHandle) -> Iterator[ProxyInThread]:
    with ProxyInThread(settings_from(config(upstream.base_url))) as running:
        yield running


def chat(url: str, key: str, model: str = "gpt-4o-mini") -> int:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    except openai.APIStatusError as failed:
        return failed.status_code
    return 200


def admin(proxy: ProxyInThread) -> httpx.Client:
    return httpx.Client(base_url=f"{proxy.url}/admin", headers=ADMIN, timeout=10)


def test_a_created_key_answers_at_once_and_its_secret_is_shown_once(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        created = api.post("/keys", json={"name": "svc-a", "rpm": 2, "models": ["gpt-4o-mini"]})
        assert created.status_code == 201, created.text
        secret = created.json()["key"]
        assert created.json()["name"] == "svc-a" and secret.startswith("sk-llmp-")
        assert chat(proxy.url, secret) == 200
        assert chat(proxy.url, secret, model="gpt-4o") == 403  # its allow-list
        assert chat(proxy.url, secret) == 200
        assert chat(proxy.url, secret) == 429  # its own rpm: 2
        assert chat(proxy.url, "sk-llmp-not-a-key") == 401
        listed = api.get("/keys").json()
        assert secret not in str(listed)
        entry = next(k for k in listed["keys"] if k["name"] == "svc-a")
        assert entry["source"] == "api" and entry["rpm"] == 2 and "key" not in entry
        assert api.post("/keys", json={"name": "svc-a"}).status_code == 409


def test_a_revoked_key_answers_401(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        secret = api.post("/keys", json={"name": "svc-b"}).json()["key"]
        assert chat(proxy.url, secret) == 200
        assert api.delete("/keys/svc-b").status_code == 204
        assert chat(proxy.url, secret) == 401
        assert api.delete("/keys/svc-b").status_code == 404


def test_a_rotation_without_grace_stops_the_old_secret_at_once(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        old = api.post("/keys", json={"name": "svc-c"}).json()["key"]
        rotated = api.post("/keys/svc-c/rotate", json={"grace": "0s"})
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["key"]
        assert new != old
        assert chat(proxy.url, new) == 200
        assert chat(proxy.url, old) == 401


def test_a_rotation_with_grace_keeps_both_secrets_working(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        old = api.post("/keys", json={"name": "svc-d"}).json()["key"]
        rotated = api.post("/keys/svc-d/rotate", json={"grace": "1h"}).json()
        assert chat(proxy.url, old) == 200
        assert chat(proxy.url, rotated["key"]) == 200
        assert rotated["previous_key_valid_until"].endswith("Z")


def test_a_patch_changes_the_limits_in_force(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        secret = api.post("/keys", json={"name": "svc-e", "models": ["gpt-4o-mini"]}).json()["key"]
        assert chat(proxy.url, secret, model="gpt-4o") == 403
        changed = api.patch("/keys/svc-e", json={"models": None, "rpm": 1})
        assert changed.status_code == 200, changed.text
        assert changed.json()["rpm"] == 1 and "models" not in changed.json()
        assert chat(proxy.url, secret, model="gpt-4o") == 200
        assert chat(proxy.url, secret, model="gpt-4o") == 429
        assert api.patch("/keys/svc-e", json={"rpm": -1}).status_code == 400
        assert api.patch("/keys/nobody", json={"rpm": 1}).status_code == 404


def test_an_expired_key_answers_401_saying_so(proxy: ProxyInThread) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    with admin(proxy) as api:
        secret = api.post("/keys", json={"name": "svc-f", "expires_at": past}).json()["key"]
        answer = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "expired_api_key"
        assert next(k for k in api.get("/keys").json()["keys"] if k["name"] == "svc-f")["expired"]


def test_config_keys_are_listed_win_and_cannot_be_changed(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        listed = api.get("/keys").json()["keys"]
        assert {"name": "config-team", "source": "config", "rpm": 100}.items() <= listed[0].items()
        assert api.post("/keys", json={"name": "config-team"}).status_code == 409
        for call in (
            api.patch("/keys/config-team", json={"rpm": 1}),
            api.post("/keys/config-team/rotate", json={}),
            api.delete("/keys/config-team"),
        ):
            assert call.status_code == 409 and call.json()["error"]["code"] == "config_key"
        assert chat(proxy.url, CONFIG_KEY) == 200


def test_a_config_keys_entry_shows_every_field_it_sets(upstream: FakeUpstreamHandle) -> None:
    """As an API key's entry does: its limits, allow-list, fair share, wait and shadow."""
    key = {"name": "full", "key": "sk-full-config", "rpm": 5, "tpd": 900, "max_parallel": 2}
    key |= {"models": ["gpt-4o"], "priority": 2, "weight": 3, "max_wait": "2s", "shadow": True}
    key |= {"budgets": [{"usd": 5, "period": "week"}], "budget_edge": "clamp"}
    settings = settings_from(config(upstream.base_url, keys=[key]))
    with ProxyInThread(settings) as running, admin(running) as api:
        [entry] = api.get("/keys").json()["keys"]
    assert entry == {
        "name": "full",
        "source": "config",
        "rpm": 5,
        "tpd": 900,
        "max_parallel": 2,
        "models": ["gpt-4o"],
        "priority": 2,
        "weight": 3,
        "max_wait": 2.0,
        "shadow": True,
        "budgets": [{"usd": 5.0, "period": "week"}],
        "budget_edge": "clamp",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "t", "team": "no-such-team"}, "team"),
        (
            {"name": "t", "limits": [{"requests": 1, "per": "1m", "models": ["gpt-5"]}]},
            "limits.0.models",
        ),
        ({"name": "t", "budgets": [{"usd": 5, "period": "year"}]}, "budgets.0.period"),
        ({"name": "t", "key": "sk-mine"}, "key"),
        ({"name": "t", "rpm": "many"}, "rpm"),
        ({"name": "t", "models": ["no-such-model"]}, "models"),
        ({"name": "t", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "t", "expires_at": "2030-01-01T00:00:00"}, "expires_at"),
        ({"name": "bad name/x"}, "name"),
        ({"rpm": 1}, "name"),
        ({"name": "t", "colour": "red"}, "colour"),
    ],
)
def test_an_invalid_entry_is_a_400_naming_the_field(
    proxy: ProxyInThread, body: dict[str, Any], param: str
) -> None:
    with admin(proxy) as api:
        answer = api.post("/keys", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_listing_is_paged_and_filtered_by_name_prefix(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        for i in range(5):
            assert api.post("/keys", json={"name": f"batch-{i}"}).status_code == 201
        first = api.get("/keys", params={"name_prefix": "batch-", "per_page": 2}).json()
        assert [k["name"] for k in first["keys"]] == ["batch-0", "batch-1"]
        assert (first["page"], first["pages"]) == (1, 3)
        last = api.get("/keys", params={"name_prefix": "batch-", "per_page": 2, "page": 3})
        assert [k["name"] for k in last.json()["keys"]] == ["batch-4"]
        assert api.get("/keys", params={"page": "0"}).status_code == 400


def test_an_api_key_in_a_team_shares_the_teams_windows(upstream: FakeUpstreamHandle) -> None:
    settings = config(upstream.base_url, teams=[{"name": "research", "rpm": 3}])
    settings["keys"][0]["team"] = "research"
    with ProxyInThread(settings_from(settings)) as proxy, admin(proxy) as api:
        created = api.post("/keys", json={"name": "svc-r", "team": "research", "rpm": 10})
        assert created.status_code == 201, created.text
        assert created.json()["team"] == "research"
        secret = created.json()["key"]
        assert [chat(proxy.url, CONFIG_KEY) for _ in range(2)] == [200, 200]
        assert chat(proxy.url, secret) == 200
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=secret, max_retries=0)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
        assert refused.value.code == "team_rpm"
        # The key's own window was not charged by the refusal; its headers are its own.
        assert refused.value.response.headers["x-ratelimit-limit-requests"] == "10"
        assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "9"
        listed = api.get("/keys", params={"team": "research"}).json()["keys"]
        assert [k["name"] for k in listed] == ["config-team", "svc-r"]
        assert api.get("/keys", params={"team": "other"}).json()["keys"] == []
        moved = api.patch("/keys/svc-r", json={"team": "elsewhere"})
        assert moved.status_code == 400 and moved.json()["error"]["param"] == "team"


def test_the_api_needs_an_admin_key(proxy: ProxyInThread) -> None:
    assert httpx.post(f"{proxy.url}/admin/keys", json={"name": "x"}).status_code == 401
    assert (
        httpx.post(
            f"{proxy.url}/admin/keys",
            json={"name": "x"},
            headers={"authorization": f"Bearer {CONFIG_KEY}"},
        ).status_code
        == 401
    )


def test_every_operation_is_audited_without_the_secret(
    proxy: ProxyInThread, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.keys.audit"), admin(proxy) as api:
        secret = api.post("/keys", json={"name": "svc-g"}).json()["key"]
        rotated = api.post("/keys/svc-g/rotate", json={"grace": "1m"}).json()["key"]
        api.patch("/keys/svc-g", json={"rpm": 5})
        api.delete("/keys/svc-g")
        api.delete("/keys/svc-g")  # not found
        metrics = httpx.get(f"{proxy.url}/metrics").text
    lines = [r for r in caplog.records if r.getMessage() == "key operation"]
    seen = [(r.operation, r.key_name, r.who, r.result) for r in lines]  # type: ignore[attr-defined]
    assert seen == [
        ("create", "svc-g", "admin.keys[1]", "success"),
        ("rotate", "svc-g", "admin.keys[1]", "success"),
        ("update", "svc-g", "admin.keys[1]", "success"),
        ("revoke", "svc-g", "admin.keys[1]", "success"),
        ("revoke", "svc-g", "admin.keys[1]", "not_found"),
    ]
    everything = caplog.text + metrics
    assert secret not in everything and rotated not in everything
    assert 'llmproxy_key_operations_total{operation="revoke",result="not_found"} 1.0' in metrics
    assert 'llmproxy_key_operations_total{operation="create",result="success"} 1.0' in metrics


def test_keys_of_the_api_survive_a_reload(upstream: FakeUpstreamHandle, tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config(upstream.base_url)))
    with ProxyInThread(settings_from(config(upstream.base_url)), config_path=path) as proxy:
        with admin(proxy) as api:
            created = api.post("/keys", json={"name": "svc-h"})
            secret = created.json()["key"]
            assert api.post("/reload").status_code == 200
        assert chat(proxy.url, secret) == 200


def test_the_admin_state_pages_the_keys_config_first_then_the_apis(
    proxy: ProxyInThread,
) -> None:
    with admin(proxy) as api:
        for name in ("api-b", "api-a"):
            assert api.post("/keys", json={"name": name, "rpm": 7}).status_code == 201
        first = api.get("/state", params={"per_page": 2}).json()
        assert [k["name"] for k in first["keys"]] == ["config-team", "api-a"]
        assert first["keys_page"] == {"page": 1, "per_page": 2, "pages": 2, "total": 3}
        second = api.get("/state", params={"per_page": 2, "page": 2}).json()
        [shown] = second["keys"]
        assert shown["name"] == "api-b"
        assert [(w["name"], w["configured"]) for w in shown["windows"]] == [("rpm", 7)]
        assert api.get("/state", params={"per_page": "x"}).status_code == 400


def test_the_key_manager_page_is_self_contained_and_lists_the_keys(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        secret = api.post("/keys", json={"name": "svc-page", "rpm": 3}).json()["key"]
        page = api.get("/key-manager")
    assert page.status_code == 200
    html = page.text
    assert 'data-key="config-team"' in html and 'data-key="svc-page"' in html
    assert "rpm 3" in html and secret not in html
    assert all(f'id="{form}"' in html for form in ("create", "rotate", "revoke"))
    assert "<link" not in html and "src=" not in html and "http" not in html.split("<script")[1]
    policy = page.headers["content-security-policy"]
    nonce = policy.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in html and "connect-src 'self'" in policy
    assert page.headers["cache-control"] == "no-store"


def test_the_admin_page_pages_the_keys_too(proxy: ProxyInThread) -> None:
    with admin(proxy) as api:
        assert api.post("/keys", json={"name": "api-z", "rpm": 9}).status_code == 201
        second = api.get("", params={"page": 2, "per_page": 1}).text
    assert 'data-key="api-z"' in second and 'data-key="config-team"' not in second
    pages = '2 keys; page <a href="?page=1&amp;per_page=1">1</a> <b>2</b>'
    assert f'<p class="muted" id="key-pages">{pages}' in second


@pytest.mark.slow
@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")
def test_with_redis_sentinel_a_created_key_lives_on_the_primary(
    upstream: FakeUpstreamHandle, sentinel_group: SentinelGroup
) -> None:
    """``redis.sentinel`` instead of ``redis.url``: the keys of the API are shared through
    the primary the sentinels name, as the budgets are (not kept in this process)."""
    sentinel = {"master": SENTINEL_MASTER, "nodes": sentinel_group.nodes}
    settings = settings_from(config(upstream.base_url, redis={"sentinel": sentinel}))
    with ProxyInThread(settings) as proxy, admin(proxy) as api:
        created = api.post("/keys", json={"name": "svc-s", "rpm": 5})
        assert created.status_code == 201, created.text
        assert chat(proxy.url, created.json()["key"]) == 200
    with sentinel_group.primary.client() as primary:
        assert primary.hexists(RECORDS, "svc-s")
