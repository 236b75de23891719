"""The config file: YAML, env interpolation, durations, and errors that name the field."""

import hashlib
from pathlib import Path
from typing import Any

import pytest

from proxy.config import settings as config
from proxy.config.settings import (
    ConfigError,
    config_warnings,
    load_settings,
    parse_duration,
    parse_settings,
    parse_size,
)

MINIMAL = {
    "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://127.0.0.1:1/v1"}]}]
}


def _problems(data: object, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_settings(data, "cfg.yaml", env or {})
    return info.value.problems


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (5, 5.0),
        (0.5, 0.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1.5", 1.5),
    ],
)
def test_durations_accept_numbers_and_units(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["10 parsecs", "-1", "s", True, [1]])
def test_bad_durations_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_sizes() -> None:
    assert parse_size("10MiB") == 10 * 2**20
    assert parse_size(1024) == 1024
    assert parse_size("2KB") == 2000


def test_minimal_config_gets_contract_defaults() -> None:
    settings = parse_settings(MINIMAL, env={})
    assert settings.redis.url == ""
    assert settings.redis.on_error == "local"
    assert settings.routing.strategy == "least-wait"
    assert settings.routing.max_wait == 30.0
    assert settings.routing.max_queue == 1000
    assert settings.routing.retries == 2
    assert settings.routing.cooldown.allowed_fails == 3
    assert settings.server.max_body_size == 10 * 2**20
    deployment = settings.models[0].deployments[0]
    assert deployment.weight == 1.0 and deployment.timeout == 60.0
    assert settings.keys == []


def test_env_interpolation_with_defaults() -> None:
    data = {
        "redis": {"url": "${REDIS_URL:-}"},
        "keys": [{"name": "a", "key": "${KEY_A}", "rpm": "${RPM:-60}"}],
        **MINIMAL,
    }
    settings = parse_settings(data, env={"KEY_A": "secret"})
    assert settings.redis.url == ""
    assert settings.keys[0].key is not None
    assert settings.keys[0].key.get_secret_value() == "secret"
    assert settings.keys[0].rpm == 60


def test_missing_env_var_names_the_field() -> None:
    data = {"keys": [{"name": "a", "key": "${NOPE}"}], **MINIMAL}
    problems = _problems(data)
    assert any("keys[0].key: environment variable NOPE is not set" in p for p in problems)


def test_unknown_keys_are_errors_with_their_path() -> None:
    data = {**MINIMAL, "routing": {"strategy": "least-wait", "colour": "blue"}}
    assert "routing.colour: unknown key" in _problems(data)


def test_every_problem_is_reported_at_once() -> None:
    data = {
        "models": [
            {
                "name": "m",
                "deployments": [{"id": "d", "base_url": "ftp://x", "rpm": -1, "timeout": "soon"}],
            }
        ],
        "routing": {"strategy": "fastest"},
    }
    problems = _problems(data)
    paths = {p.split(":")[0] for p in problems}
    assert {
        "models[0].deployments[0].base_url",
        "models[0].deployments[0].rpm",
        "models[0].deployments[0].timeout",
        "routing.strategy",
    } <= paths


def test_cross_references_are_checked() -> None:
    data = {
        "keys": [{"name": "a", "key": "k", "models": ["nope"]}],
        "models": [
            {"name": "m", "deployments": [{"id": "d", "base_url": "http://h/v1"}]},
            {"name": "n", "deployments": [{"id": "d", "base_url": "http://h/v1"}]},
        ],
        "routing": {"fallbacks": {"m": ["zzz"]}},
    }
    problems = _problems(data)
    assert "keys[0].models: unknown model 'nope'" in problems
    assert "models[].deployments: duplicate id 'd'" in problems
    assert "routing.fallbacks.m: unknown model 'zzz'" in problems


def test_a_key_needs_exactly_one_secret() -> None:
    both = {"keys": [{"name": "a", "key": "k", "key_sha256": "0" * 64}], **MINIMAL}
    neither = {"keys": [{"name": "a"}], **MINIMAL}
    assert any(p.startswith("keys[0]") for p in _problems(both))
    assert any(p.startswith("keys[0]") for p in _problems(neither))
    assert any(
        "key_sha256" in p
        for p in _problems({"keys": [{"name": "a", "key_sha256": "xyz"}], **MINIMAL})
    )


def test_load_settings_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models: [\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value)
    assert "invalid YAML" in info.value.problems[0]


def test_repository_configs_are_valid() -> None:
    root = Path(__file__).parent.parent / "config"
    env = {"TEAM_A_KEY": "x", "OPENAI_KEY_A": "y", "OPENAI_KEY_B": "z"}
    for name in ("demo.yaml", "example.yaml"):
        load_settings(root / name, env=env)


def test_days_are_a_duration_unit() -> None:
    assert parse_duration("30d") == 30 * 86400.0
    assert parse_duration("1d12h") == 1.5 * 86400.0


def test_limits_as_data_shorthands_and_windows() -> None:
    key = {
        "name": "batch",
        "key": "k",
        "rpm": 600,
        "tpd": 5_000_000,
        "limits": [{"tokens": 200_000_000, "per": "30d"}, {"requests": 5, "per": "1s"}],
    }
    deployment = {"id": "d", "base_url": "http://127.0.0.1:1/v1", "rpd": 1000}
    settings = parse_settings(
        {"keys": [key], "models": [{"name": "m", "deployments": [deployment]}]}, env={}
    )
    rules = [(r.kind, r.amount, r.per) for r in settings.keys[0].limit_rules()]
    assert rules == [
        ("requests", 600, 60.0),
        ("tokens", 5_000_000, 86400.0),
        ("tokens", 200_000_000, 30 * 86400.0),
        ("requests", 5, 1.0),
    ]
    assert [(r.kind, r.per) for r in settings.models[0].deployments[0].limit_rules()] == [
        ("requests", 86400.0)
    ]


def test_teams_are_owners_of_windows_like_keys() -> None:
    team = {
        "name": "research",
        "rpm": 2000,
        "max_parallel": 20,
        "limits": [{"tokens": 1_000_000, "per": "1d", "models": ["m"]}],
    }
    key = {"name": "alice", "key": "k", "team": "research", "rpm": 10}
    settings = parse_settings({"teams": [team], "keys": [key], **MINIMAL}, env={})
    research = settings.team("research")
    assert research is not None and research.max_parallel == 20
    assert [(r.kind, r.amount, r.per, r.models) for r in research.limit_rules()] == [
        ("requests", 2000, 60.0, ()),
        ("tokens", 1_000_000, 86400.0, ("m",)),
    ]
    assert settings.keys[0].team == "research"


def test_a_window_may_be_given_again_for_other_models() -> None:
    limits = [{"requests": 2, "per": "1m", "models": ["m"]}]
    key = {"name": "a", "key": "k", "rpm": 10, "limits": limits}
    settings = parse_settings({"keys": [key], **MINIMAL}, env={})
    assert [r.models for r in settings.keys[0].limit_rules()] == [(), ("m",)]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"teams": [{"name": "t"}], "keys": [{"name": "a", "key": "k", "team": "tt"}]},
            "keys[0].team: unknown team 'tt'; did you mean 't'?",
        ),
        ({"teams": [{"name": "t"}, {"name": "t"}]}, "teams: duplicate name 't'"),
        ({"teams": [{"name": "t", "rpm": 0}]}, "teams[0].rpm: must be greater than 0"),
        ({"teams": [{"rpm": 5}]}, "teams[0].name: is required"),
        (
            {"keys": [{"name": "a", "key": "k", "limits": [{"requests": 1, "per": "1m",
                                                             "models": ["mm"]}]}]},
            "keys[0].limits[0].models: unknown model 'mm'; did you mean 'm'?",
        ),
        (
            {"teams": [{"name": "t", "limits": [{"requests": 1, "per": "1m", "models": ["x"]}]}]},
            "teams[0].limits[0].models: unknown model 'x'",
        ),
        (
            {"keys": [{"name": "a", "key": "k", "limits": [{"requests": 1, "per": "1m",
                                                             "models": []}]}]},
            "keys[0].limits[0].models: needs at least one item",
        ),
    ],
)  # fmt: skip
def test_team_and_model_filter_errors_name_the_field(data: dict[str, object], problem: str) -> None:
    assert problem in _problems({**data, **MINIMAL})


def test_a_deployments_window_takes_no_models_filter() -> None:
    deployment = {
        "id": "d",
        "base_url": "http://127.0.0.1:1/v1",
        "limits": [{"requests": 1, "per": "1m", "models": ["m"]}],
    }
    problems = _problems({"models": [{"name": "m", "deployments": [deployment]}]})
    assert any(p.startswith("models[0].deployments[0].limits: 'models' filters") for p in problems)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            [{"requests": 5, "tokens": 5, "per": "1m"}],
            "exactly one of 'requests', 'tokens', 'input_tokens' or 'output_tokens'",
        ),
        ([{"per": "1m"}], "exactly one of 'requests', 'tokens', 'input_tokens' or 'output_tokens'"),
        ([{"requests": 5, "per": "500ms"}], "per"),
        ([{"requests": 0, "per": "1m"}], "requests"),
        ([{"requests": 5, "per": "1m"}], "two limits on requests per 60s"),  # rpm: 10 too
    ],
)
def test_bad_limits_name_the_field(limits: list[dict[str, object]], message: str) -> None:
    data = {"keys": [{"name": "a", "key": "k", "rpm": 10, "limits": limits}], **MINIMAL}
    problems = _problems(data)
    assert any(p.startswith("keys[0]") and message in p for p in problems), problems


# -- errors in plain words, all in one pass ----------------------------------------------


def test_problems_are_in_plain_words() -> None:
    data = {"models": [{"name": "m", "deployments": []}], "keys": [{"key": "k"}]}
    problems = _problems(data)
    assert "models[0].deployments: needs at least one item" in problems
    assert "keys[0].name: is required" in problems
    assert not any("Field required" in p or "validation" in p for p in problems)


def test_an_unknown_key_suggests_the_one_meant() -> None:
    data = {**MINIMAL, "routing": {"stratgy": "least-wait"}}
    assert "routing.stratgy: unknown key; did you mean 'strategy'?" in _problems(data)
    keyed = {"keys": [{"name": "a", "key": "k", "rmp": 5}], **MINIMAL}
    assert "keys[0].rmp: unknown key; did you mean 'rpm'?" in _problems(keyed)


def test_a_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n  - name: m\n    deployments: [\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    (problem,) = info.value.problems
    assert problem.startswith("invalid YAML at line ") and "unicode string" not in problem
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("models:\n\t- name: m\n", "invalid YAML at line 2, column 1: a tab; YAML indents"),
        (
            "models:\n  - name: m\n   deployments: []\n",
            "invalid YAML at line 3, column 4: the indentation does not line up",
        ),
        ("models:\n  - name: a: b\n", "invalid YAML at line 2, column 12: an unexpected ':'"),
    ],
)
def test_common_yaml_mistakes_are_named_at_their_line(tmp_path: Path, text: str, says: str) -> None:
    """The usual causes in plain words, PyYAML's own phrase kept after them."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    (problem,) = info.value.problems
    assert problem.startswith(says) and "YAML says:" in problem


def test_an_unset_variable_is_one_clear_problem() -> None:
    """Its empty stand-in fails no second check: not the URL pattern of its own field, not
    a number, not a check of the entry that holds it (a key without its secret)."""
    deployment = {"id": "d", "base_url": "${UPSTREAM_URL}/v1", "rpm": "${RPM}"}
    data = {
        "keys": [{"name": "a", "key": "${TEAM_A_KEY}"}],
        "models": [{"name": "m", "deployments": [deployment]}],
    }
    assert sorted(_problems(data)) == [
        "keys[0].key: environment variable TEAM_A_KEY is not set",
        "models[0].deployments[0].base_url: environment variable UPSTREAM_URL is not set",
        "models[0].deployments[0].rpm: environment variable RPM is not set",
    ]


def test_an_unset_variable_hides_no_problem_of_another_entry() -> None:
    data = {
        "keys": [{"name": "a", "key": "${TEAM_A_KEY}"}, {"name": "b"}],
        **MINIMAL,
    }
    assert sorted(_problems(data)) == [
        "keys[0].key: environment variable TEAM_A_KEY is not set",
        "keys[1]: give exactly one of 'key' (non-empty) or 'key_sha256'",
    ]


@pytest.mark.parametrize(
    "url",
    ["", "redis://r:6379/0", "rediss://r:6380", "unix:///run/redis.sock", "redis+cluster://r:7000"],
)
def test_redis_urls_the_limiter_can_use(url: str) -> None:
    assert parse_settings({**MINIMAL, "redis": {"url": url}}).redis.url == url


def test_a_redis_url_of_another_scheme_is_an_error_not_a_runtime_surprise() -> None:
    (problem,) = _problems({**MINIMAL, "redis": {"url": "http://redis:6379"}})
    assert problem.startswith("redis.url: must be a redis://, rediss://, unix:// or")


def test_a_sentinel_managed_primary_as_the_contract_spells_it(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    sentinel = {
        "master": "mymaster",
        "nodes": ["10.0.0.5:26379", "[fd00::7]:26379"],
        "username": "${REDIS_USER:-}",
        "password": "${REDIS_PASSWORD:-pw}",
        "tls": {"ca_file": str(ca)},
    }
    settings = parse_settings({**MINIMAL, "redis": {"sentinel": sentinel}}, env={})
    config = settings.redis.sentinel
    assert config is not None and settings.redis.shared and not settings.redis.url
    assert config.addresses() == [("10.0.0.5", 26379), ("fd00::7", 26379)]
    assert config.password.get_secret_value() == "pw" and not config.username.get_secret_value()
    assert not isinstance(config.tls, bool) and config.tls.ca_file == str(ca)
    plain = parse_settings({**MINIMAL, "redis": {"sentinel": {**sentinel, "tls": False}}})
    assert plain.redis.sentinel is not None and plain.redis.sentinel.tls is False


@pytest.mark.parametrize(
    ("redis", "says"),
    [
        (
            {"url": "redis://r:6379", "sentinel": {"master": "m", "nodes": ["s:26379"]}},
            "redis: set either url or sentinel, not both",
        ),
        (
            {"sentinel": {"master": "m", "nodes": ["s"]}},
            "redis.sentinel.nodes: a sentinel is host:port, e.g. 10.0.0.5:26379 (got 's')",
        ),
        ({"sentinel": {"master": "m", "nodes": []}}, "redis.sentinel.nodes: needs at least"),
        ({"sentinel": {"nodes": ["s:26379"]}}, "redis.sentinel.master: is required"),
        (
            {"sentinel": {"master": "m", "nodes": ["s:1"], "sentinels": []}},
            "redis.sentinel.sentinels: unknown key",
        ),
    ],
)
def test_a_sentinel_mistake_names_its_field(redis: dict[str, object], says: str) -> None:
    (problem,) = _problems({**MINIMAL, "redis": redis})
    assert problem.startswith(says)


def test_cross_section_checks_come_with_the_field_errors() -> None:
    data = {
        "keys": [{"name": "a", "key": "k", "models": ["gpt-4o-mni"]}],
        "models": [{"name": "gpt-4o-mini", "deployments": [{"id": "d", "base_url": "ftp://x"}]}],
    }
    data["routing"] = {"fallbacks": {"gpt-4o-mini": ["gpt-4o"]}, "retries": -1}
    problems = _problems(data)
    assert any(p.startswith("models[0].deployments[0].base_url: must be a URL") for p in problems)
    assert "routing.retries: must be at least 0" in problems
    assert "keys[0].models: unknown model 'gpt-4o-mni'; did you mean 'gpt-4o-mini'?" in problems
    assert "routing.fallbacks.gpt-4o-mini: unknown model 'gpt-4o'" in " ".join(problems)


def test_choices_are_case_insensitive() -> None:
    data = {
        **MINIMAL,
        "server": {"log_level": "INFO"},
        "routing": {"strategy": "Least-Wait"},
        "redis": {"on_error": "Local"},
    }
    settings = parse_settings(data, "cfg.yaml", {})
    assert settings.server.log_level == "info" and settings.routing.strategy == "least-wait"
    assert settings.redis.on_error == "local"


def test_an_openai_base_url_without_v1_is_a_warning_not_an_error() -> None:
    deployment = {"id": "d", "base_url": "https://api.openai.com"}
    settings = parse_settings({"models": [{"name": "m", "deployments": [deployment]}]})
    (warning,) = config_warnings(settings)
    assert warning.startswith("models[0].deployments[0].base_url") and "/v1" in warning
    assert config_warnings(parse_settings(MINIMAL)) == []


def _azure(**fields: object) -> dict[str, object]:
    deployment = {"id": "az", "base_url": "https://r.openai.azure.com", **fields}
    return {"models": [{"name": "m", "deployments": [deployment]}]}


def test_an_azure_deployment_needs_its_deployment_name_and_api_version() -> None:
    problems = _problems(_azure(provider="azure"))
    assert "models[0].deployments[0].deployment: is required with provider: azure" in problems
    assert "models[0].deployments[0].api_version: is required with provider: azure" in problems


def test_azure_fields_on_an_openai_deployment_are_an_error_not_ignored() -> None:
    problems = _problems(_azure(deployment="gpt-4o-prod"))
    assert problems == [
        "models[0].deployments[0].deployment: is only for provider: azure"
        " (this deployment is openai)"
    ]


def test_azure_fields_must_be_safe_in_a_url_and_the_provider_known() -> None:
    bad = _azure(provider="azure", deployment="a/b", api_version="2024-10-21&x=1")
    assert _problems(bad) == [
        "models[0].deployments[0].deployment: may contain only letters, digits and _ . -",
        "models[0].deployments[0].api_version: may contain only letters, digits and _ . -",
    ]
    problems = _problems(_azure(provider="nonesuch"))
    assert problems == [
        "models[0].deployments[0].provider: must be one of 'openai', 'azure', 'anthropic',"
        " 'bedrock', 'bedrock-converse', 'gemini' or 'vertex' (got 'nonesuch')"
    ]


def test_a_complete_azure_deployment_and_a_shadow_key() -> None:
    data = _azure(provider="Azure", deployment="gpt-4o-prod", api_version="2024-10-21")
    data["keys"] = [{"name": "k", "key": "s", "rpm": 5, "shadow": True}]
    settings = parse_settings(data, env={})
    d = settings.models[0].deployments[0]
    assert (d.provider, d.deployment, d.api_version) == ("azure", "gpt-4o-prod", "2024-10-21")
    assert settings.keys[0].shadow is True
    assert parse_settings(MINIMAL, env={}).models[0].deployments[0].provider == "openai"


def test_an_azure_base_url_ending_in_openai_is_warned_about() -> None:
    data = _azure(provider="azure", deployment="x", api_version="2024-10-21")
    data["models"][0]["deployments"][0]["base_url"] += "/openai"  # type: ignore[index]
    (warning,) = config_warnings(parse_settings(data, env={}))
    assert "without /openai" in warning


def test_an_anthropic_deployment_is_checked_and_its_base_url_with_v1_warned_about() -> None:
    deployment = {
        "id": "an",
        "provider": "Anthropic",
        "base_url": "https://api.anthropic.com/v1",
        "api_key": "sk-ant-api03-secret-value",
        "limits": [{"requests": 4000, "per": "1m"}],
    }
    data = {"models": [{"name": "claude", "deployments": [deployment]}]}
    settings = parse_settings(data, env={})
    assert settings.models[0].deployments[0].provider == "anthropic"
    (warning,) = config_warnings(settings)
    assert "without /v1" in warning and "/v1/v1/messages" in warning
    with pytest.raises(ConfigError, match="deployment"):
        parse_settings(
            {"models": [{"name": "c", "deployments": [{**deployment, "deployment": "x"}]}]},
            env={},
        )


def test_a_long_key_list_is_checked_in_chunks_with_every_problem_in_its_place() -> None:
    """Over 200 keys the list is validated a chunk at a time (a reload in a thread lets
    the event loop run between chunks): same keys, same order, same problem paths."""
    keys: list[dict[str, object]] = [
        {"name": f"k{i}", "key": f"sk-{i}", "rpm": 1} for i in range(1201)
    ]
    data = {
        "keys": keys,
        "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
    }
    settings = parse_settings(data, "<test>", env={})
    assert [k.name for k in settings.keys] == [f"k{i}" for i in range(1201)]
    assert settings.keys[1200].digest() == hashlib.sha256(b"sk-1200").digest()
    keys[1100]["rpm"] = 0
    keys[7]["colour"] = "red"
    with pytest.raises(ConfigError) as info:
        parse_settings({**data, "routing": {"retries": -1}}, "<test>", env={})
    assert sorted(p.split(":")[0] for p in info.value.problems) == [
        "keys[1100].rpm",
        "keys[7].colour",
        "routing.retries",
    ]


def _with(key: dict[str, object], **group: object) -> dict[str, object]:
    model = {**MINIMAL["models"][0], **group}
    return {"keys": [{"name": "k", "key": "sk-1", **key}], "models": [model]}


def test_budgets_and_prices_are_read() -> None:
    budgets = [
        {"usd": 50, "period": "month"},
        {"tokens": 2_000_000, "period": "Day", "models": ["m"]},
        {"requests": 100, "period": "week"},
    ]
    price = {"input": 2.5, "cached_input": 1.25, "output": 10}
    settings = parse_settings(_with({"budgets": budgets}, price=price), env={})
    [usd, tokens, requests] = settings.keys[0].budgets
    assert (usd.kind, usd.limit, usd.period) == ("usd", 50.0, "month")
    assert (tokens.kind, tokens.period, tokens.models) == ("tokens", "day", ["m"])
    assert requests.kind == "requests"
    group_price = settings.models[0].price
    assert group_price is not None and group_price.cache_read is None


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"usd": 5}, "keys[0].budgets[0].period"),
        ({"usd": 5, "period": "year"}, "keys[0].budgets[0].period"),
        ({"usd": 5, "tokens": 9, "period": "day"}, "keys[0].budgets[0]"),
        ({"usd": -1, "period": "day"}, "keys[0].budgets[0].usd"),
        ({"usd": "nan", "period": "day"}, "keys[0].budgets[0].usd"),
        ({"tokens": 9, "period": "day", "models": ["nope"]}, "keys[0].budgets[0].models"),
    ],
)
def test_a_bad_budget_names_its_field(budget: dict[str, object], field: str) -> None:
    problems = _problems(_with({"budgets": [budget]}))
    assert any(p.startswith(field) for p in problems), problems


def test_budget_edge_is_read_for_keys_and_teams_and_a_bad_one_names_its_field() -> None:
    budget = {"usd": 5, "period": "day"}
    data = _with({"budgets": [budget], "budget_edge": "Clamp", "team": "t"})
    data["teams"] = [{"name": "t", "budgets": [budget], "budget_edge": "clamp"}]
    settings = parse_settings(data, env={})
    assert settings.keys[0].budget_edge == settings.teams[0].budget_edge == "clamp"
    assert parse_settings(_with({"budgets": [budget]}), env={}).keys[0].budget_edge == "refuse"
    problems = _problems(_with({"budget_edge": "trim"}))
    assert any(p.startswith("keys[0].budget_edge") for p in problems), problems
    bad_team = {**MINIMAL, "teams": [{"name": "t", "budget_edge": 1}]}
    problems = _problems(bad_team)
    assert any(p.startswith("teams[0].budget_edge") for p in problems), problems


def test_a_budget_given_twice_is_refused() -> None:
    twice = [{"usd": 5, "period": "day"}, {"usd": 9, "period": "day"}]
    assert any("two budgets of usd per day" in p for p in _problems(_with({"budgets": twice})))


@pytest.mark.parametrize("price", [{"input": -1}, {"output": "inf"}, {"input": 1, "colour": 2}])
def test_a_bad_price_names_its_field(price: dict[str, object]) -> None:
    problems = _problems(_with({}, price=price))
    assert any(p.startswith("models[0].price") for p in problems), problems


def test_a_dollar_budget_over_an_unpriced_model_and_budgets_without_redis_are_warned() -> None:
    settings = parse_settings(_with({"budgets": [{"usd": 5, "period": "day"}]}), env={})
    warnings = config_warnings(settings)
    assert any("keys[0].budgets[0]" in w and "without a price" in w for w in warnings)
    assert any("forgotten on restart" in w for w in warnings)
    priced = _with({"budgets": [{"usd": 5, "period": "day"}]}, price={"input": 1, "output": 2})
    priced["redis"] = {"url": "redis://127.0.0.1:1"}
    assert config_warnings(parse_settings(priced, env={})) == []


def test_the_shorthands_are_distinct_windows() -> None:
    # _Limited._distinct_windows checks only the ``limits`` list against them: the
    # shorthands alone cannot repeat a window.
    windows = [(kind, per) for _, kind, per in config._SHORTHANDS]
    assert len(set(windows)) == len(windows)


@pytest.mark.parametrize(
    "document",
    [
        {"keys": [{"name": "a", "key": "${A_KEY}"}], **MINIMAL},
        {"keys": [{"name": "a", "key": "k"}], 7: {"b": "${A_KEY}"}, **MINIMAL},  # not JSON
        {"keys": [{"name": "a", "key": "${A_KEY}"}], b"x": 1, **MINIMAL},  # not JSON at all
    ],
)
def test_a_variable_is_substituted_wherever_the_document_is_unusual(
    document: dict[Any, Any],
) -> None:
    problems = _problems(document)
    assert any(p.endswith(": environment variable A_KEY is not set") for p in problems), problems


def test_a_variable_deep_in_a_long_key_list_is_substituted() -> None:
    keys: list[dict[str, Any]] = [{"name": f"k{i}", "key": f"sk-{i}"} for i in range(2500)]
    keys[2100]["key"] = "${KEY_2100}"
    settings = parse_settings({"keys": keys, **MINIMAL}, env={"KEY_2100": "sk-from-env"})
    assert settings.keys[2100].digest() == hashlib.sha256(b"sk-from-env").digest()


@pytest.mark.parametrize(
    ("value", "margin"), [("auto", "auto"), ("AUTO", "auto"), ("20ms", 0.02), (0, 0.0), ("1s", 1.0)]
)
def test_the_pacing_margin_is_auto_or_a_duration(value: object, margin: object) -> None:
    settings = parse_settings({**MINIMAL, "routing": {"pacing_margin": value}}, "cfg.yaml", {})
    assert settings.routing.pacing_margin == margin
    assert parse_settings(MINIMAL, "cfg.yaml", {}).routing.pacing_margin == "auto"  # default


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("fast", "expected auto or a duration such as 20ms"),
        ("2s", "a pacing margin is at most 1s"),
        ("-5ms", "expected auto or a duration"),
        (True, "expected auto or a duration"),
    ],
)
def test_a_pacing_margin_neither_auto_nor_a_duration_is_an_error_naming_the_field(
    value: object, says: str
) -> None:
    [problem] = _problems({**MINIMAL, "routing": {"pacing_margin": value}})
    assert problem.startswith("routing.pacing_margin: ") and says in problem, problem


def test_a_bedrock_deployment_needs_its_region_and_only_it_has_aws_fields() -> None:
    """As design.md's example: ``region`` and, optionally, ``aws_access_key_id`` and
    ``aws_secret_access_key`` (else botocore's default chain) on the deployment itself; its
    base_url defaults to the region's Bedrock runtime endpoint."""
    bedrock = {"provider": "bedrock", "model": "anthropic.claude-3-haiku-20240307-v1:0"}
    assert _problems(_azure(**bedrock)) == [
        "models[0].deployments[0].region: is required with provider: bedrock"
    ]
    assert _problems(_azure(provider="openai", aws_access_key_id="AKIDX")) == [
        "models[0].deployments[0]: aws_access_key_id: is only for Bedrock's providers"
    ]
    assert _problems(_azure(provider="openai", region="us-east-1")) == [
        "models[0].deployments[0].region: is only for Vertex AI and Bedrock"
        " (this deployment is openai)"
    ]
    (problem,) = _problems(_azure(**bedrock, region="us-east-1", aws_access_key_id="AKIDX"))
    assert "aws_access_key_id" in problem and "aws_secret_access_key" in problem, problem
    (problem,) = _problems(_azure(**bedrock, region="Mars"))
    assert problem.startswith("models[0].deployments[0].region: is not an AWS region"), problem
    settings = parse_settings(_azure(**bedrock, region="us-east-1"), env={})
    deployment = settings.models[0].deployments[0]
    assert deployment.aws is not None and deployment.aws.region == "us-east-1"
    assert deployment.base_url == "https://r.openai.azure.com"  # given: kept
    given = {
        "models": [{"name": "m", "deployments": [{"id": "b", **bedrock, "region": "eu-west-3"}]}]
    }
    url = parse_settings(given, env={}).models[0].deployments[0].base_url
    assert url == "https://bedrock-runtime.eu-west-3.amazonaws.com"


def test_a_bedrock_deployment_without_botocore_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "botocore" else found(name)
    )
    bedrock = {"provider": "bedrock", "model": "m", "region": "us-east-1"}
    (problem,) = _problems(_azure(**bedrock))
    assert "provider: needs botocore" in problem and "extra" in problem, problem
