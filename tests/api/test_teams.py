"""Teams and model-scoped windows as a client sees them, through a real proxy (in-memory
limiter) and the real fake upstream, with the OpenAI SDK as the client: keys of a team
share its windows, a refusal charges nothing anywhere, a window with ``models`` counts
only those models' requests, ``/admin/state`` shows teams, and a reload keeps a team's
state and moves a key to another team."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from support.proxy_server import ProxyInThread, settings_from

from proxy.config.settings import load_settings
from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread

ADMIN = "adm-teams"
ALICE, BOB, CAROL = "sk-alice", "sk-bob", "sk-carol"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0)) as handle:
        yield handle


def config(upstream_url: str, **changes: Any) -> dict[str, Any]:
    deployment = {"base_url": upstream_url, "api_key": "upstream-secret"}
    data: dict[str, Any] = {
        # Windows of a day: nothing refills while a test runs, however slow the machine.
        "teams": [{"name": "research", "rpd": 6}, {"name": "infra", "rpd": 100}],
        "keys": [
            {"name": "alice", "key": ALICE, "team": "research", "rpd": 5},
            {"name": "bob", "key": BOB, "team": "research", "rpd": 5},
            {
                "name": "carol",
                "key": CAROL,
                "limits": [{"requests": 2, "per": "1d", "models": ["gpt-4o"]}],
            },
        ],
        "models": [
            {"name": "gpt-4o", "deployments": [{"id": "big", **deployment}]},
            {"name": "gpt-4o-mini", "deployments": [{"id": "small", **deployment}]},
        ],
        "routing": {"retries": 0},
        "admin": {"keys": [ADMIN]},
    }
    data.update(changes)
    return data


def chat(proxy: ProxyInThread, key: str, model: str = "gpt-4o-mini") -> httpx.Response:
    """One request as the OpenAI SDK sends it; its raw answer, whatever the status."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)
    try:
        return client.chat.completions.with_raw_response.create(
            model=model, messages=HI, max_tokens=5
        ).http_response
    except openai.APIStatusError as refused:
        return refused.response


def admin_state(proxy: ProxyInThread) -> dict[str, Any]:
    answer = httpx.get(
        f"{proxy.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def remaining(view: dict[str, Any], section: str, name: str) -> dict[str, float]:
    """An owner's windows' remaining requests (a day's window refills a little meanwhile:
    to a tenth)."""
    [owner] = [o for o in view[section] if o["name"] == name]
    return {w["name"]: round(w["remaining"], 1) for w in owner["windows"]}


def test_two_keys_of_a_team_of_6_sending_5_each_get_6_through(
    upstream: FakeUpstreamHandle,
) -> None:
    async def burst(proxy: ProxyInThread) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{proxy.base_url}/chat/completions",
                        json={"model": "gpt-4o-mini", "messages": HI, "max_tokens": 5},
                        headers={"authorization": f"Bearer {key}"},
                    )
                    for key in [ALICE, BOB] * 5
                )
            )

    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        answers = asyncio.run(burst(proxy))
        view = admin_state(proxy)
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 6 and statuses.count(429) == 4, statuses
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.json()["error"]["code"] == "team_rpd"
        assert "this key's team" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # The headers are the key's own window (5 a day), not the team's.
        assert refused.headers["x-ratelimit-limit-requests"] == "5"
    # What the keys spent adds up to what the team spent; nothing refused was charged.
    keys = [5 - remaining(view, "keys", k)["rpd"] for k in ("alice", "bob")]
    assert sum(keys) == 6 and remaining(view, "teams", "research")["rpd"] == 0
    [research] = [t for t in view["teams"] if t["name"] == "research"]
    assert research["windows"][0]["configured"] == 6
    assert {k["name"]: k["team"] for k in view["keys"]}["alice"] == "research"


@pytest.mark.slow
def test_a_key_refusal_leaves_its_team_alone_and_a_team_refusal_its_key(
    upstream: FakeUpstreamHandle,
) -> None:
    teams = [{"name": "research", "rpd": 3}, {"name": "infra", "rpd": 100}]
    keys = [
        {"name": "alice", "key": ALICE, "team": "research", "rpd": 1},
        {"name": "bob", "key": BOB, "team": "research", "rpd": 5},
    ]
    with ProxyInThread(settings_from(config(upstream.base_url, teams=teams, keys=keys))) as proxy:
        assert chat(proxy, ALICE).status_code == 200
        refused = chat(proxy, ALICE)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_rpd"
        assert remaining(admin_state(proxy), "teams", "research")["rpd"] == 2
        assert [chat(proxy, BOB).status_code for _ in range(3)] == [200, 200, 429]
        assert remaining(admin_state(proxy), "keys", "bob")["rpd"] == 3


@pytest.mark.slow
def test_a_model_scoped_window_limits_only_its_models(upstream: FakeUpstreamHandle) -> None:
    with ProxyInThread(settings_from(config(upstream.base_url))) as proxy:
        assert [chat(proxy, CAROL, "gpt-4o").status_code for _ in range(2)] == [200, 200]
        third = chat(proxy, CAROL, "gpt-4o")
        assert third.status_code == 429
        assert third.json()["error"]["code"] == "key_rpd"
        assert "requests per day" in third.json()["error"]["message"]
        assert [chat(proxy, CAROL).status_code for _ in range(3)] == [200, 200, 200]
        [scoped] = next(k for k in admin_state(proxy)["keys"] if k["name"] == "carol")["windows"]
    assert (scoped["name"], scoped["models"], scoped["remaining"]) == ("rpd@gpt-4o", ["gpt-4o"], 0)


@pytest.mark.slow
def test_a_teams_model_scoped_window_counts_every_key_of_the_team_on_its_models(
    upstream: FakeUpstreamHandle,
) -> None:
    teams = [{"name": "research", "limits": [{"requests": 1, "per": "1d", "models": ["gpt-4o"]}]}]
    keys = [
        {"name": "alice", "key": ALICE, "team": "research"},
        {"name": "bob", "key": BOB, "team": "research"},
    ]
    with ProxyInThread(settings_from(config(upstream.base_url, teams=teams, keys=keys))) as proxy:
        assert chat(proxy, ALICE, "gpt-4o").status_code == 200
        refused = chat(proxy, BOB, "gpt-4o")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "team_rpd"
        assert chat(proxy, BOB, "gpt-4o-mini").status_code == 200


@pytest.mark.slow
def test_a_reload_keeps_a_teams_state_and_moves_a_key_to_another_team(
    upstream: FakeUpstreamHandle, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    before = config(upstream.base_url)
    path.write_text(yaml.safe_dump(before))
    with ProxyInThread(load_settings(path), config_path=path) as proxy:
        assert [chat(proxy, ALICE).status_code for _ in range(4)] == [200] * 4
        after = config(upstream.base_url)
        after["keys"][1]["team"] = "infra"  # bob moves
        after["teams"][0]["rpd"] = 7  # research's limit changes, its state stays
        path.write_text(yaml.safe_dump(after))
        reload = httpx.post(
            f"{proxy.url}/admin/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
        )
        assert reload.status_code == 200, reload.text
        assert reload.json()["teams"]["changed"] == ["research"]
        assert reload.json()["keys"]["changed"] == ["bob"]
        view = admin_state(proxy)
        assert remaining(view, "teams", "research")["rpd"] == 3  # 7 less the 4 spent before
        assert [chat(proxy, BOB).status_code for _ in range(5)] == [200] * 5  # infra's now
        assert remaining(admin_state(proxy), "teams", "infra")["rpd"] == 95
        assert chat(proxy, ALICE).status_code == 200
        assert chat(proxy, ALICE).status_code == 429  # alice's own 5 a day


@pytest.mark.slow
def test_a_shadow_key_counts_its_teams_refusals_and_goes_on(upstream: FakeUpstreamHandle) -> None:
    teams = [{"name": "research", "rpd": 1}]
    keys = [{"name": "alice", "key": ALICE, "team": "research", "shadow": True}]
    with ProxyInThread(settings_from(config(upstream.base_url, teams=teams, keys=keys))) as proxy:
        metric = 'llmproxy_shadow_rejections_total{key="alice",limit="team_rpd"}'
        assert f"{metric} 0.0" in httpx.get(f"{proxy.url}/metrics", timeout=5).text
        assert [chat(proxy, ALICE).status_code for _ in range(3)] == [200, 200, 200]
        assert f"{metric} 2.0" in httpx.get(f"{proxy.url}/metrics", timeout=5).text
        # Charged only what enforcing would have let through.
        assert remaining(admin_state(proxy), "teams", "research")["rpd"] == 0
