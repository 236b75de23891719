"""Teams of the admin API: their entries checked as a config team's, their store the keys'
(``RecordStore``) in a real Redis, and the catalog asking it for the team a key names.

What one replica's store writes another's sees at its next look; a store that lost its
data is filled again from what the replicas knew; a store never read answers 503 for a
team it may hold, never "no team"; the catalog builds an API team's limits once and again
when its record changes, and drops them when it is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.ports import free_port
from support.proxy_server import settings_from

from proxy.catalog.catalog import Catalog, key_limits
from proxy.config.settings import ClientKey
from proxy.errors import InvalidRequest, ServiceUnavailable
from proxy.keys.memory_backend import MemoryBackend
from proxy.keys.redis_backend import RedisKeyBackend, RedisRecordBackend, key_names
from proxy.keys.store import Conflict, KeyRevoked, RuntimeKeys
from proxy.keys.team_records import TEAMS, TeamRecord, validate_team
from proxy.keys.teams import RuntimeTeams, runtime_teams_for

MODELS = frozenset({"m", "other"})
TEAM_RECORDS = key_names("apiteams")[0]


def _keep(spec: dict[str, Any]) -> dict[str, Any]:
    return spec


def _store(url: str) -> RuntimeTeams:
    return RuntimeTeams(RedisRecordBackend(url, kind=TEAMS), shared=True, poll_interval=3600)


@pytest.fixture
async def pair(redis_url: str) -> AsyncIterator[tuple[RuntimeTeams, RuntimeTeams]]:
    a, b = _store(redis_url), _store(redis_url)
    await a.start()
    await b.start()
    yield a, b
    await a.aclose()
    await b.aclose()


def test_an_entry_is_checked_as_a_config_teams() -> None:
    body = {"name": "squad", "rpm": 5, "budgets": [{"usd": 3, "period": "week"}]}
    assert validate_team(body, name=None, models=MODELS) == (
        "squad",
        {k: body[k] for k in body if k != "name"},
    )
    assert validate_team({"rpm": 1}, name="squad", models=MODELS) == ("squad", {"rpm": 1})
    refusals: list[tuple[dict[str, Any], str | None, str | None]] = [
        ({"name": "s", "rpm": 0}, None, "rpm"),
        (
            {"name": "s", "limits": [{"tokens": 5, "per": "1m", "models": ["x"]}]},
            None,
            "limits.0.models",
        ),
        (
            {"name": "s", "budgets": [{"usd": 1, "period": "day", "models": ["x"]}]},
            None,
            "budgets.0.models",
        ),
        ({"name": "s", "rpm": 1, "limits": [{"requests": 2, "per": "1m"}]}, None, None),
        ({"name": "other"}, "s", "name"),
        ({"name": "a b"}, None, "name"),
        ({"models": ["m"]}, "s", "models"),
    ]
    for body, name, param in refusals:
        with pytest.raises(InvalidRequest) as refused:
            validate_team(body, name=name, models=MODELS)
        assert refused.value.param == param, body


async def test_what_one_store_writes_the_other_sees_at_its_next_look(
    pair: tuple[RuntimeTeams, RuntimeTeams],
) -> None:
    a, b = pair
    await a.create("squad", {"rpm": 5})
    assert b.team("squad") is None
    await b.refresh()
    team = b.team("squad")
    assert team is not None and team.rpm == 5

    await b.update("squad", {"rpm": 7, "max_parallel": 2}, _keep)
    await a.refresh()
    team = a.team("squad")
    assert team is not None and (team.rpm, team.max_parallel) == (7, 2)
    with pytest.raises(Conflict) as exists:
        await b.create("squad", {})
    assert exists.value.code == "team_exists"

    gone: list[str] = []
    b.on_gone = gone.append
    await a.delete("squad")
    await b.refresh()
    assert b.team("squad") is None and gone == ["squad"] and len(b) == 0
    with pytest.raises(KeyRevoked) as again:
        await b.delete("squad")
    assert again.value.code == "team_deleted"


async def test_a_key_is_in_use_only_once_the_team_it_names_is_known(
    pair: tuple[RuntimeTeams, RuntimeTeams], redis_url: str
) -> None:
    """A key and its new team made on one replica: the other's key store, reading the
    key before its team store has looked again, reads the teams first (``cover``), so
    the key is never served there without its team's limits (a race seen in CI: its
    windows were counted apart from the other replica's)."""
    a_teams, b_teams = pair
    a_keys, b_keys = (
        RuntimeKeys(RedisKeyBackend(redis_url), shared=True, poll_interval=3600) for _ in "ab"
    )
    b_keys.before_apply = b_teams.cover
    for store in (a_keys, b_keys):
        await store.start()
    try:
        await a_teams.create("squad", {"rpm": 5})
        await a_keys.create("member", {"team": "squad"}, None)
        await a_keys.create("loner", {}, None)
        assert b_teams.team("squad") is None  # not looked since
        await b_keys.refresh()
        assert b_keys.index.get("member") is not None
        team = b_teams.team("squad")
        assert team is not None and team.rpm == 5
    finally:
        for store in (a_keys, b_keys):
            await store.aclose()


async def test_a_flushed_store_is_filled_again_from_what_the_replicas_knew(
    pair: tuple[RuntimeTeams, RuntimeTeams], redis_url: str
) -> None:
    a, b = pair
    await a.create("squad", {"rpm": 5})
    await b.refresh()
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        await b.refresh()  # b writes back what it knew
        assert b.losses == 1 and b.last_loss is not None
        assert b.last_loss["outcome"] == "restored" and b.last_loss["teams_gone"] == 0
        assert await client.hexists(TEAM_RECORDS, "squad")
    finally:
        await client.aclose()
    await a.refresh()
    assert a.losses == 1 and a.team("squad") is not None
    await a.update("squad", {"rpm": 9}, _keep)  # still changeable everywhere
    await b.refresh()
    team = b.team("squad")
    assert team is not None and team.rpm == 9


async def test_a_store_never_read_answers_503_for_a_team_it_may_hold() -> None:
    nowhere = runtime_teams_for(f"redis://127.0.0.1:{free_port()}", workers=1, timeout=0.2)
    nowhere._poll_interval = 3600
    await nowhere.start()
    try:
        assert nowhere.state() == "unread" and nowhere.needed(key_api=True)
        with pytest.raises(ServiceUnavailable) as refused:
            nowhere.team("squad")
        assert refused.value.code == "key_store_unavailable"
        with pytest.raises(ServiceUnavailable):
            await nowhere.create("squad", {})
    finally:
        await nowhere.aclose()


async def test_several_workers_without_redis_refuse_teams_by_api() -> None:
    refused = runtime_teams_for("", workers=2, timeout=1.0)
    assert not refused.shared
    with pytest.raises(Conflict) as conflict:
        await refused.create("squad", {})
    assert "redis.url" in str(conflict.value) and "Teams cannot be managed" in str(conflict.value)


async def test_the_catalog_builds_an_api_teams_limits_again_when_it_changes() -> None:
    settings = settings_from(
        {
            "teams": [{"name": "research", "rpm": 10}],
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    catalog = Catalog(settings)
    teams = RuntimeTeams(MemoryBackend(TEAMS), shared=False)
    catalog.runtime_teams = teams
    teams.on_gone = catalog.forget_team
    key = ClientKey(name="k", key_sha256="0" * 64, team="squad", rpm=50)
    mine = key_limits(key)
    assert catalog.ask_limits(key, mine, "m").team is None  # no such team (yet)

    await teams.create("squad", {"rpm": 3, "budgets": [{"requests": 9, "period": "day"}]})
    asked = catalog.ask_limits(key, mine, "m")
    assert asked.team is not None and asked.team.name == "squad"
    assert [w.rate.limit for w in asked.team.windows] == [3]
    assert [q.name for q in asked.team.quotas] == ["budget_requests_day"]
    assert catalog.ask_limits(key, mine, "m") is asked  # built once

    await teams.update("squad", {"rpm": 4}, _keep)
    changed = catalog.ask_limits(key, mine, "m")
    assert changed is not asked and changed.team is not None
    assert [w.rate.limit for w in changed.team.windows] == [4]
    # The config's team wins on a name; a key of a config team never asks the store.
    config_key = ClientKey(name="c", key_sha256="1" * 64, team="research")
    research = catalog.ask_limits(config_key, key_limits(config_key), "m").team
    assert research is catalog.team_limits["research"]

    await teams.delete("squad")
    assert catalog.ask_limits(key, mine, "m").team is None
    assert "squad" not in catalog._api_teams


async def test_a_team_record_round_trips_through_json() -> None:
    record = TeamRecord("squad", {"rpm": 5}, 1.0, 2.0)
    assert TeamRecord.from_json(record.to_json()) == record
    assert record.public()["updated_at"] == "1970-01-01T00:00:02Z"
    assert record.team().rpm == 5
