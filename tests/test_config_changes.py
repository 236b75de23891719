"""What a reload changes, by name, and what it cannot change without a restart."""

from __future__ import annotations

from typing import Any

from proxy.config.changes import config_changes, in_force
from proxy.config.settings import Settings, parse_settings


def _settings(**overrides: Any) -> Settings:
    data: dict[str, Any] = {
        "keys": [{"name": "a", "key": "sk-a", "rpm": 10}, {"name": "b", "key": "sk-b"}],
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "d1", "base_url": "http://127.0.0.1:1/v1", "rpm": 60},
                    {"id": "d2", "base_url": "http://127.0.0.1:2/v1"},
                ],
            }
        ],
    }
    data.update(overrides)
    return parse_settings(data, "<test>", env={})


def test_the_same_file_changes_nothing() -> None:
    changes = config_changes(_settings(), _settings())
    assert not changes.any and changes.restart_needed == ()


def test_teams_are_listed_by_name() -> None:
    old = _settings(teams=[{"name": "t1", "rpm": 5}, {"name": "t2"}])
    new = _settings(teams=[{"name": "t1", "rpm": 6}, {"name": "t3"}])
    changes = config_changes(old, new)
    assert changes.any and changes.as_dict()["teams"] == {
        "added": ["t3"],
        "removed": ["t2"],
        "changed": ["t1"],
    }


def test_keys_are_listed_by_name_added_removed_and_changed_never_by_secret() -> None:
    new = _settings(
        keys=[{"name": "a", "key": "sk-rotated", "rpm": 10}, {"name": "c", "key": "sk-c"}]
    )
    changes = config_changes(_settings(), new)
    assert changes.keys.as_dict() == {"added": ["c"], "removed": ["b"], "changed": ["a"]}
    assert "sk-" not in repr(changes.as_dict())


def test_deployments_are_named_with_their_model() -> None:
    old = _settings()
    new = _settings(
        models=[
            {
                "name": "m",
                "deployments": [
                    {"id": "d1", "base_url": "http://127.0.0.1:1/v1", "rpm": 120},
                    {"id": "d3", "base_url": "http://127.0.0.1:3/v1"},
                ],
            }
        ]
    )
    changes = config_changes(old, new)
    assert changes.deployments.as_dict() == {
        "added": ["m/d3"],
        "removed": ["m/d2"],
        "changed": ["m/d1"],
    }
    assert not changes.models  # the group's own fields did not change


def test_process_level_settings_need_a_restart_and_stay_in_force() -> None:
    old = _settings()
    new = _settings(
        redis={"url": "redis://127.0.0.1:7000"},
        server={"header_timeout": "3s", "log_level": "debug", "max_body_size": "1MB"},
    )
    changes = config_changes(old, new)
    assert changes.restart_needed == ("redis.url", "server.header_timeout", "server.log_level")
    assert changes.other == ("server",)  # max_body_size is applied
    applied = in_force(old, new)
    assert applied.redis == old.redis
    assert applied.server.header_timeout == old.server.header_timeout
    assert applied.server.log_level == old.server.log_level
    assert applied.server.max_body_size == new.server.max_body_size


def test_a_section_that_differs_only_in_restart_fields_is_not_listed_as_applied() -> None:
    changes = config_changes(_settings(), _settings(server={"log_level": "error"}))
    assert changes.other == () and changes.restart_needed == ("server.log_level",)


def test_the_config_watcher_interval_is_read_at_start_and_kept_by_a_reload() -> None:
    old = _settings(server={"watch_config": "5s"})
    new = _settings(server={"watch_config": "1s"})
    changes = config_changes(old, new)
    assert changes.restart_needed == ("server.watch_config",) and changes.other == ()
    assert in_force(old, new).server.watch_config == 5.0


def test_the_body_timeout_is_the_protocols_and_needs_a_restart() -> None:
    """The HTTP protocol reads it at start (as header_timeout): the endpoint keeps the
    same value, so both bounds of a body agree."""
    old = _settings()
    new = _settings(server={"body_timeout": "5s"})
    assert config_changes(old, new).restart_needed == ("server.body_timeout",)
    assert in_force(old, new).server.body_timeout == old.server.body_timeout == 30.0


def test_traces_are_switched_at_start_and_their_content_by_a_reload() -> None:
    """The tracer provider is the process's, built at start
    (proxy/observability/tracing.py): a reload keeps ``telemetry.traces`` as it was and says
    it needs a restart; whether prompts and completions are recorded is each pipeline's,
    applied."""
    old = _settings()
    new = _settings(telemetry={"traces": True, "record_content": True})
    changes = config_changes(old, new)
    assert changes.restart_needed == ("telemetry.traces",)
    assert changes.other == ("telemetry",)  # record_content
    applied = in_force(old, new).telemetry
    assert (applied.traces, applied.record_content) == (False, True)
    only_traces = config_changes(old, _settings(telemetry={"traces": True}))
    assert only_traces.other == () and only_traces.restart_needed == ("telemetry.traces",)
