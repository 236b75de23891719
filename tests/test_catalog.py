"""The catalog turns configured limits into limiter windows: names, shares, capacities."""

from __future__ import annotations

import pytest
from support.proxy_server import settings_from

from proxy.catalog.announced import ANNOUNCED_FOR
from proxy.catalog.catalog import Catalog, key_limits, pacing_headroom
from proxy.catalog.pacing import INITIAL_MARGIN, RESERVE, Lateness, Pacing
from proxy.config.settings import ClientKey, Settings
from proxy.limiter.base import DAY, Rate, Window, describe, window_name
from proxy.limiter.core.verdicts import key_code


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _catalog(share: float = 1.0, clock: Clock | None = None, pacing_margin: float = 0.0) -> Catalog:
    deployment = {
        "id": "d",
        "base_url": "http://127.0.0.1:1/v1",
        "rpm": 600,
        "tpm": 60_000,
        "rpd": 10_000,
        "burst": 2,
    }
    key = {"name": "k", "key": "s", "rpm": 60, "limits": [{"tokens": 1000, "per": "30d"}]}
    models = [{"name": "m", "deployments": [deployment]}]
    routing = {"pacing_margin": pacing_margin}
    return Catalog(
        settings_from({"keys": [key], "models": models, "routing": routing}),
        share,
        clock or Clock(),
    )


def test_window_names_say_kind_and_period() -> None:
    assert [window_name("requests", p) for p in (60.0, DAY, 1.0, 3600.0, 0.5)] == [
        "rpm",
        "rpd",
        "requests_1s",
        "requests_1h",
        "requests_500ms",
    ]
    assert [window_name("tokens", p) for p in (60.0, DAY, 30 * DAY, 90.0)] == [
        "tpm",
        "tpd",
        "tokens_30d",
        "tokens_90s",
    ]
    assert describe(Window("tokens_30d", "tokens", Rate(5, 30 * DAY, 5))) == "tokens per 30d"
    assert describe(Window("rpd", "requests", Rate(5, DAY, 5))) == "requests per day"


def test_deployments_pace_requests_within_a_minute_and_cap_longer_windows() -> None:
    [route] = _catalog().groups["m"].deployments
    windows = {w.name: w.rate for w in route.limits.windows}
    # Paced 1% below the configured limit (jitter), within a minute only.
    assert windows["rpm"] == Rate(594.0, 60.0, 2.0)  # burst: paced
    # Tokens paced: one request ahead at most, one up to the whole minute's allowance
    # (the configured one: the headroom paces, it never refuses).
    assert windows["tpm"] == Rate(59_400.0, 60.0, 1.0, ceiling=60_000.0)
    assert windows["rpd"] == Rate(10_000.0, DAY, 10_000.0)  # caps the day's total


def test_the_pacing_headroom_never_costs_a_long_window_a_request() -> None:
    """rpd: 5 is 5 a day, not 4.95 (the fifth would wait a day)."""
    deployment = {
        "id": "d",
        "base_url": "http://127.0.0.1:1/v1",
        "rpd": 5,
        "limits": [{"tokens": 7, "per": "1h"}],
    }
    settings = settings_from({"models": [{"name": "m", "deployments": [deployment]}]})
    [route] = Catalog(settings).groups["m"].deployments
    windows = {w.name: w.rate for w in route.limits.windows}
    assert windows == {"rpd": Rate(5.0, DAY, 5.0), "tokens_1h": Rate(7.0, 3600.0, 7.0)}


def test_windows_of_a_minute_or_less_are_paced_for_turns_up_to_the_pacing_margin_late() -> None:
    """routing.pacing_margin fixed at 50 ms: 11 turns of "10 a second" then span 1 s +
    50 ms (the 1% for the network is covered by it, not added), so a turn sent up to 50
    ms late leaves every upstream window of 1 s or more within its limit; a day's window
    only caps the total (no headroom: it does not pace)."""
    assert pacing_headroom(0.05) == pytest.approx(1 - 1 / 1.05)
    assert pacing_headroom(0.0) == pytest.approx(0.01)  # the 1% alone, as before
    [route] = _catalog(pacing_margin=0.05).groups["m"].deployments
    windows = {w.name: w.rate for w in route.limits.windows}
    assert 10 * windows["rpm"].interval == pytest.approx(1.0 + 0.05)
    assert 1000 * windows["tpm"].interval == pytest.approx(1.0 + 0.05)
    assert windows["rpd"] == Rate(10_000.0, DAY, 10_000.0)
    catalog = _catalog(pacing_margin=0.05)  # an announced limit is paced the same
    catalog.announced.announce(route, requests=300, tokens=None)
    [rpm] = [w.rate for w in catalog.limits(route).windows if w.name == "rpm"]
    assert 5 * rpm.interval == pytest.approx(1.0 + 0.05)
    default = Catalog(settings_from({"models": [{"name": "m", "deployments": [{
        "id": "d", "base_url": "http://127.0.0.1:1/v1", "rpm": 600}]}]}))  # fmt: skip
    assert default.pacing.auto  # measured; before any turn, the initial 50 ms
    assert default.pacing_margin == pytest.approx(INITIAL_MARGIN + RESERVE)


def _auto_catalog(clock: Clock) -> Catalog:
    deployment = {"id": "d", "base_url": "http://127.0.0.1:1/v1", "rpm": 600, "rpd": 10_000}
    settings = settings_from({"models": [{"name": "m", "deployments": [deployment]}]})
    pacing = Pacing(None, "here", clock, Lateness(clock, initial=0.003))
    return Catalog(settings, 1.0, clock, pacing)


def test_with_an_auto_margin_the_limits_follow_the_margin_in_force() -> None:
    """The limits every operation reads (Catalog.limits) are paced with the margin in
    force as it moves: a late turn here, a replica heard needing more, an announced
    limit paced the same; windows longer than a minute never change."""
    clock = Clock()
    catalog = _auto_catalog(clock)
    [route] = catalog.groups["m"].deployments

    def rates() -> dict[str, Rate]:
        return {w.name: w.rate for w in catalog.limits(route).windows}

    assert 10 * rates()["rpm"].interval == pytest.approx(1.0 / 0.99)  # 3 ms: the 1% covers it
    catalog.pacing.record(0.0295)  # a turn 29.5 ms late: widened at once (+ RESERVE)
    assert 10 * rates()["rpm"].interval == pytest.approx(1.032)
    catalog.pacing.heard({"other": 0.0721})
    assert 10 * rates()["rpm"].interval == pytest.approx(1.075)
    assert rates()["rpd"] == Rate(10_000.0, DAY, 10_000.0)
    catalog.announced.announce(route, requests=300, tokens=None)
    assert 5 * rates()["rpm"].interval == pytest.approx(1.075)


def test_a_reload_keeps_the_margin_measured() -> None:
    clock = Clock()
    before = _auto_catalog(clock)
    before.pacing.record(0.0405)
    after = _auto_catalog(clock)
    after.carry_over(before)
    assert after.pacing is before.pacing
    [route] = after.groups["m"].deployments
    [rpm] = [w.rate for w in after.limits(route).windows if w.name == "rpm"]
    assert 10 * rpm.interval == pytest.approx(1.043)


def test_keys_hold_their_whole_allowance_and_workers_their_share() -> None:
    halves = _catalog(share=0.5).key_limits["k"]
    assert [(w.name, w.rate) for w in halves.windows] == [
        ("rpm", Rate(30.0, 60.0, 30.0)),
        ("tokens_30d", Rate(500.0, 30 * DAY, 500.0)),
    ]


def test_an_announced_lower_limit_replaces_the_configured_one_everywhere() -> None:
    catalog = _catalog()
    [route] = catalog.groups["m"].deployments
    assert catalog.announced.announce(route, requests=300, tokens=None) == {"rpm": 300}
    rates = {w.name: w.rate.limit for w in catalog.limits(route).windows}
    assert rates == {"rpm": 297.0, "tpm": 59_400.0, "rpd": 10_000.0}
    assert catalog.announced.announce(route, requests=300, tokens=90_000) == {}  # nothing lower


def test_anthropics_announced_input_and_output_limits_lower_their_own_kinds() -> None:
    catalog = Catalog(
        settings_from(
            {
                "models": [
                    {
                        "name": "claude",
                        "deployments": [
                            {
                                "id": "an",
                                "provider": "anthropic",
                                "base_url": "https://api.anthropic.com",
                                "limits": [
                                    {"input_tokens": 40_000, "per": "1m"},
                                    {"output_tokens": 8_000, "per": "1m"},
                                ],
                            }
                        ],
                    }
                ]
            }
        )
    )
    [route] = catalog.groups["claude"].deployments
    lowered = catalog.announced.announce(route, None, 10_000, 30_000, 9_000)
    assert lowered == {"input_tokens_1m": 30_000}  # output: no lower; no tokens window
    rates = {w.name: w.rate.limit for w in catalog.limits(route).windows}
    assert rates["input_tokens_1m"] == pytest.approx(30_000 / (1 + catalog.pacing.margin()))


def test_an_announced_limit_paces_no_lower_than_a_tenth_and_refuses_nothing() -> None:
    """One answer announcing a limit of 1 token (or request) a minute: pacing comes down
    to a tenth of the configured limits, and a request as large as the configured
    minute's allowance still goes (alone)."""
    catalog = _catalog()
    [route] = catalog.groups["m"].deployments
    assert catalog.announced.announce(route, requests=1, tokens=1) == {"rpm": 60, "tpm": 6000}
    rates = {w.name: w.rate for w in catalog.limits(route).windows}
    assert rates["rpm"] == Rate(59.4, 60.0, 2.0)
    assert rates["tpm"] == Rate(5_940.0, 60.0, 1.0, ceiling=60_000.0)
    assert rates["rpd"] == Rate(10_000.0, DAY, 10_000.0)  # a longer window is not theirs


def test_an_announcement_not_repeated_is_forgotten() -> None:
    clock = Clock()
    catalog = _catalog(clock=clock)
    [route] = catalog.groups["m"].deployments
    assert catalog.announced.announce(route, requests=300, tokens=None) == {"rpm": 300}
    clock.now += ANNOUNCED_FOR - 1.0
    assert catalog.announced.announce(route, requests=300, tokens=None) == {}  # said again: kept
    clock.now += ANNOUNCED_FOR - 1.0
    assert catalog.limits(route) != route.limits
    clock.now += 1.0
    assert catalog.limits(route) == route.limits  # not said for ANNOUNCED_FOR: configured
    assert catalog.announced.announce(route, requests=300, tokens=None) == {"rpm": 300}
    assert catalog.announced.announce(route, requests=600, tokens=None) == {}  # no lower any more
    assert catalog.limits(route) == route.limits


def test_azure_deployments_are_reached_by_deployment_name_api_version_and_api_key() -> None:
    azure = {
        "id": "az",
        "provider": "azure",
        "base_url": "https://r.openai.azure.com/",
        "deployment": "gpt-4o-prod",
        "api_version": "2024-10-21",
        "api_key": "azure-secret",
    }
    plain = {"id": "oa", "base_url": "https://api.openai.com/v1", "api_key": "sk-1"}
    settings = settings_from({"models": [{"name": "m", "deployments": [azure, plain]}]})
    az, oa = Catalog(settings).groups["m"].deployments
    assert str(az.target("chat/completions")[0]) == (
        "https://r.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions"
        "?api-version=2024-10-21"
    )
    embeddings, _ = az.target("embeddings")
    assert str(embeddings).endswith("/gpt-4o-prod/embeddings?api-version=2024-10-21")
    assert az.provider.credential(az.config) == ("api-key", "azure-secret")
    assert str(oa.target("completions")[0]) == "https://api.openai.com/v1/completions"
    assert oa.provider.credential(oa.config) == ("authorization", "Bearer sk-1")


# -- teams and model-scoped windows ---------------------------------------------------


def _teams_settings() -> Settings:
    deployment = {"id": "d", "base_url": "http://127.0.0.1:1/v1"}
    models = [{"name": n, "deployments": [{**deployment, "id": n}]} for n in ("big", "small")]
    teams = [
        {
            "name": "research",
            "rpm": 100,
            "max_parallel": 8,
            "limits": [{"tokens": 500, "per": "1m", "models": ["big"]}],
            "budgets": [
                {"usd": 50, "period": "month"},
                {"tokens": 9000, "period": "day", "models": ["big"]},
            ],
        }
    ]
    keys = [
        {
            "name": "alice",
            "key": "a",
            "team": "research",
            "rpm": 10,
            "limits": [{"requests": 2, "per": "1m", "models": ["big"]}],
        },
        {"name": "bob", "key": "b", "rpm": 5},
        {
            "name": "dave",
            "key": "d",
            "budgets": [
                {"usd": 5, "period": "day"},
                {"tokens": 100, "period": "day", "models": ["big"]},
            ],
        },
        {"name": "erin", "key": "e", "budgets": [{"usd": 1, "period": "day", "models": ["big"]}]},
    ]
    return settings_from({"teams": teams, "keys": keys, "models": models})


def _teams_catalog(share: float = 1.0) -> Catalog:
    return Catalog(_teams_settings(), share)


def _key(_: Catalog, name: str) -> ClientKey:
    return next(k for k in _teams_settings().keys if k.name == name)


def test_a_key_in_a_team_carries_the_teams_windows() -> None:
    catalog = _teams_catalog(share=0.5)
    alice = catalog.key_limits["alice"]
    assert alice.team is catalog.team_limits["research"]
    assert alice.team.scope == "team" and alice.team.max_parallel == 4  # a worker's share
    assert [w.name for w in alice.all_windows] == ["rpm", "rpm@big", "rpm", "tpm@big"]
    assert catalog.key_limits["bob"].team is None


def test_a_request_is_checked_against_the_windows_counting_its_model() -> None:
    catalog = _teams_catalog()
    key = _key(catalog, "alice")
    alice = catalog.key_limits["alice"]
    big = catalog.ask_limits(key, alice, "big")
    small = catalog.ask_limits(key, alice, "small")
    assert [w.name for w in big.windows] == ["rpm", "rpm@big"]
    assert [w.name for w in small.windows] == ["rpm"]
    assert big.team is not None and [w.name for w in big.team.windows] == ["rpm", "tpm@big"]
    assert small.team is not None and [w.name for w in small.team.windows] == ["rpm"]
    # Computed once per key and model; a key without a team or filters is itself.
    assert catalog.ask_limits(key, alice, "big") is big
    bob = catalog.key_limits["bob"]
    assert catalog.ask_limits(_key(catalog, "bob"), bob, "big") is bob


def test_a_request_is_charged_to_the_budgets_counting_its_model() -> None:
    """Budgets go through the filter windows go through: the limiter never sees one
    over other models (no reservation, no quota in its step)."""
    catalog = _teams_catalog()
    dave = catalog.key_limits["dave"]
    big = catalog.ask_limits(_key(catalog, "dave"), dave, "big")
    small = catalog.ask_limits(_key(catalog, "dave"), dave, "small")
    assert [q.name for q in big.quotas] == ["budget_usd_day", "budget_tokens_day:big"]
    assert [q.name for q in small.quotas] == ["budget_usd_day"]
    assert catalog.ask_limits(_key(catalog, "dave"), dave, "small") is small
    # A key whose every budget is over other models: nothing to reserve for this one.
    erin = catalog.key_limits["erin"]
    assert catalog.ask_limits(_key(catalog, "erin"), erin, "small").all_quotas == ()
    assert catalog.ask_limits(_key(catalog, "erin"), erin, "big") is erin


def test_a_teams_budgets_count_only_the_requests_of_their_models() -> None:
    catalog = _teams_catalog()
    alice = catalog.key_limits["alice"]
    small = catalog.ask_limits(_key(catalog, "alice"), alice, "small").team
    big = catalog.ask_limits(_key(catalog, "alice"), alice, "big").team
    assert small is not None and [q.name for q in small.quotas] == ["budget_usd_month"]
    assert big is not None and [q.name for q in big.quotas] == [
        "budget_usd_month",
        "budget_tokens_day:big",
    ]


def test_a_fallback_adds_the_limits_of_its_model_and_drops_those_of_the_one_asked_for() -> None:
    catalog = _teams_catalog()
    alice = catalog.key_limits["alice"]
    key = _key(catalog, "alice")
    assert catalog.scoped(key) and not catalog.scoped(_key(catalog, "bob"))
    added, dropped = catalog.fallback_limits(key, alice, "small", "big")
    assert [w.name for w in added.windows] == ["rpm@big"]
    assert added.team is not None and [w.name for w in added.team.windows] == ["tpm@big"]
    assert [q.name for q in added.team.quotas] == ["budget_tokens_day:big"]
    assert dropped.unlimited and dropped.team is not None  # a team's key's: kept
    back, _ = catalog.fallback_limits(key, alice, "big", "small")
    assert back.unlimited
    assert added.max_parallel is None and added.team.max_parallel is None


def test_a_model_scoped_window_refuses_with_its_windows_code() -> None:
    catalog = _teams_catalog()
    [_, scoped] = catalog.key_limits["alice"].windows
    assert (scoped.name, key_code(scoped), describe(scoped)) == (
        "rpm@big",
        "key_rpm",
        "requests per minute",
    )
    [_, team_scoped] = catalog.team_limits["research"].windows
    assert key_code(team_scoped, "team") == "team_tpm"


def test_an_api_key_gets_its_team_from_the_config_in_force() -> None:
    catalog = _teams_catalog()
    entry = {"name": "carol", "key_sha256": "0" * 64, "team": "research"}
    carol = ClientKey.model_validate(entry)
    own = key_limits(carol)
    assert own.team is None
    asked = catalog.ask_limits(carol, own, "big")  # every window of the team counts
    assert asked.team is catalog.team_limits["research"]
    assert catalog.with_team(carol, own).team is catalog.team_limits["research"]
    # A team the config no longer has: none.
    gone = ClientKey.model_validate({**entry, "team": "gone"})
    assert catalog.ask_limits(gone, key_limits(gone), "small").team is None


def test_a_revoked_api_keys_limits_are_forgotten() -> None:
    catalog = _teams_catalog()
    carol = ClientKey.model_validate({"name": "carol", "key_sha256": "0" * 64, "team": "research"})
    own = key_limits(carol)
    before = len(catalog.held())
    asked = [catalog.ask_limits(carol, own, model) for model in ("big", "small")]
    assert len(catalog.held()) == before + 2
    catalog.forget("carol")
    assert len(catalog.held()) == before
    assert catalog.ask_limits(carol, own, "big") is not asked[0]  # built again if it returns


def test_a_name_routes_to_its_group_and_a_patterns_deployment_sends_it_as_asked() -> None:
    """``Catalog.route``: exact names (a group's, an alias) first, then the longest
    pattern; a pattern group's deployment without ``model:`` names none of its own (the
    client's goes upstream), with one it names it; an exact group's sends its name."""
    url = "http://127.0.0.1:1/v1"
    catalog = Catalog(
        settings_from(
            {
                "models": [
                    {
                        "name": "s",
                        "aliases": ["s-1"],
                        "deployments": [{"id": "a", "base_url": url}],
                    },
                    {"name": "c*", "deployments": [{"id": "b", "base_url": url}]},
                    {
                        "name": "co*",
                        "deployments": [{"id": "c", "base_url": url, "model": "opus"}],
                    },
                ]
            }
        )
    )
    routed = {name: catalog.route(name) for name in ("s", "s-1", "c-x", "co-x", "x")}
    assert {n: None if g is None else g.name for n, g in routed.items()} == {
        "s": "s",
        "s-1": "s",
        "c-x": "c*",
        "co-x": "co*",
        "x": None,
    }
    model = {
        d.id: d.model_for("chat_completions")
        for g in catalog.groups.values()
        for d in g.deployments
    }
    assert model == {"a": "s", "b": None, "c": "opus"}
