"""The proxy's configs the bench runs (the default one, the headline, and the bench's
large-burst one) and the report's statement of them beside the peer's, rule by rule."""

from __future__ import annotations

import pytest

from loadtest.bench import configs, peer
from loadtest.bench.model import DEFAULT_CONFIG, HEADLINE, LARGE_BURST, TARGETS
from proxy.catalog.catalog import DEFAULT_DEPLOYMENT_BURST
from proxy.config.settings import parse_settings

UPSTREAM = "http://127.0.0.1:41234"
REDIS = "redis://127.0.0.1:41235/0"


def _deployment(config: str) -> dict[str, object]:
    settings = configs.proxy_config(UPSTREAM, REDIS, config=config)
    return settings["models"][0]["deployments"][0]  # type: ignore[index,no-any-return]


def test_the_default_config_leaves_burst_unset_and_paces_far_above_the_load() -> None:
    deployment = _deployment(DEFAULT_CONFIG)
    assert "burst" not in deployment and DEFAULT_DEPLOYMENT_BURST == 1
    assert deployment["rpm"] == configs.DEFAULT_RPM
    # Over 10x the most the 2-core machine ever served (8,405 req/s at 64 connections).
    assert configs.DEFAULT_RPM / 60 >= 10 * 8_405


def test_the_large_burst_config_is_the_benchs_own() -> None:
    assert {k: v for k, v in _deployment(LARGE_BURST).items() if k in ("rpm", "burst")} == {
        "rpm": 100_000_000,
        "burst": 100_000,
    }


@pytest.mark.parametrize("config", [DEFAULT_CONFIG, LARGE_BURST])
def test_both_configs_are_valid_with_auth_a_key_with_rpm_and_tpm_and_redis(config: str) -> None:
    settings = parse_settings(configs.proxy_config(UPSTREAM, REDIS, config=config), env={})
    (key,) = settings.keys
    assert (key.rpm, key.tpm) == (configs.KEY_RPM, configs.KEY_TPM)
    assert settings.redis.url == REDIS
    (deployment,) = settings.models[0].deployments
    assert deployment.burst == _deployment(config).get("burst")


def test_without_limits_there_is_no_key_or_deployment_limit() -> None:
    settings = parse_settings(configs.proxy_config(UPSTREAM, None, limits=False), env={})
    assert (settings.keys[0].rpm, settings.keys[0].tpm) == (None, None)
    (deployment,) = settings.models[0].deployments
    assert (deployment.rpm, deployment.burst) == (None, None)
    assert settings.redis.url == ""


def test_an_unknown_config_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown bench config 'fast'"):
        configs.proxy_config(UPSTREAM, REDIS, config="fast")


def test_the_headline_target_runs_the_default_config_with_redis_and_2_workers() -> None:
    assert (HEADLINE.backend, HEADLINE.workers, HEADLINE.config) == ("redis", 2, DEFAULT_CONFIG)
    assert HEADLINE.slug == "redis-2w-default" and HEADLINE in TARGETS
    large_burst = [t for t in TARGETS if t.proxy and t.config == LARGE_BURST]
    limited = [t for t in large_burst if t.backend != "nolimit"]
    assert limited and all(t.label.endswith(", burst 100000") for t in limited)
    assert len({t.slug for t in TARGETS}) == len(TARGETS)


def _table(rule: str) -> dict[str, list[str]]:
    rows = configs.configuration_table(rule)
    cells = [row.strip("|").split(" | ") for row in rows[2:]]
    return {cell[0].strip(): [c.strip() for c in cell[1:]] for cell in cells}


def test_the_configurations_are_stated_rule_by_rule_from_what_ran() -> None:
    table = _table(peer.DEFAULT_RULE)
    assert list(table) == list(configs.RULE_NAMES)
    assert (
        "TensorZero, rule `requests+tokens` |" in configs.configuration_table("requests+tokens")[0]
    )
    ours_default, ours_burst, theirs = table["client key's limits"]
    assert ours_default == ours_burst == "`rpm: 100000000`, `tpm: 10000000000`"
    assert "`model_inferences_per_minute = 1000000000`" in theirs
    assert "`tokens_per_minute = 1000000000`" in theirs
    ours_default, ours_burst, theirs = table["deployment's limits"]
    assert ours_default == ("`rpm: 6000000`, `burst` unset (the default, 1: turns 10 us apart)")
    assert ours_burst == "`rpm: 100000000`, `burst: 100000`"
    assert theirs.startswith("none")


def test_the_peers_rule_is_choosable_and_the_table_says_which_ran() -> None:
    table = _table("requests")
    theirs = table["client key's limits"][2]
    assert "`model_inferences_per_minute = 1000000000`" in theirs
    assert "tokens_per_minute" not in theirs
    assert "TensorZero, rule `requests` |" in configs.configuration_table("requests")[0]
