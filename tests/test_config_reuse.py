"""A reload's key list: an entry that did not change keeps the key in force, once that
was built (``parse_settings(previous=...)``); everything else is checked as ever."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.settings import ConfigError, Settings, parse_settings

KEYS = 250


def _document(keys: list[dict[str, Any]]) -> dict[str, Any]:
    models = [{"name": "m", "deployments": [{"id": "a", "base_url": "http://u/v1"}]}]
    return {"keys": keys, "models": models}


def _keys() -> list[dict[str, Any]]:
    return [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 60} for i in range(KEYS)]


def _first() -> Settings:
    first = parse_settings(_document(_keys()), env={})
    list(first.keys)  # every key built, as requests presenting them would
    return first


def test_unchanged_entries_keep_their_keys_a_changed_one_is_validated_anew() -> None:
    first = _first()
    entries = _keys()
    entries[7]["rpm"] = 30
    second = parse_settings(_document(entries), env={}, previous=first)
    assert second.keys[7] is not first.keys[7]
    assert second.keys[7].rpm == 30
    assert all(second.keys[i] is first.keys[i] for i in range(KEYS) if i != 7)
    assert second.keys == parse_settings(_document(entries), env={}).keys


def test_a_changed_entry_that_is_now_invalid_is_reported_in_its_place() -> None:
    first = _first()
    entries = _keys()
    entries[230]["rpm"] = 0
    with pytest.raises(ConfigError) as exc:
        parse_settings(_document(entries), env={}, previous=first)
    assert [p.split(":")[0] for p in exc.value.problems] == ["keys[230].rpm"]


def test_an_entry_is_compared_after_its_variables_are_substituted() -> None:
    entries = _keys()
    entries[3]["key"] = "${SECRET}"
    first = parse_settings(_document(entries), env={"SECRET": "old"})
    list(first.keys)
    second = parse_settings(_document(entries), env={"SECRET": "new"}, previous=first)
    assert second.keys[3] is not first.keys[3]
    assert second.keys[3].key is not None
    assert second.keys[3].key.get_secret_value() == "new"
    assert second.keys[4] is first.keys[4]


def test_an_entry_whose_value_changes_type_is_validated_anew() -> None:
    first = _first()
    entries = _keys()
    entries[5]["rpm"] = "60"  # not plain: validated in full, the same number
    second = parse_settings(_document(entries), env={}, previous=first)
    assert second.keys[5] is not first.keys[5]
    assert second.keys[5].rpm == 60


def test_a_key_with_budgets_is_validated_anew_and_equal() -> None:
    entries = _keys()
    entries[9]["budgets"] = [{"tokens": 1000, "period": "day"}]
    first = parse_settings(_document(entries), env={})
    list(first.keys)
    second = parse_settings(_document(entries), env={}, previous=first)
    assert second.keys[9] == first.keys[9]
    assert second.keys[8] is first.keys[8]


def test_a_key_not_built_yet_is_built_once_for_each_config() -> None:
    first = parse_settings(_document(_keys()), env={})
    second = parse_settings(_document(_keys()), env={}, previous=first)
    assert second.keys[2] == first.keys[2]
    assert second.keys[2] is second.keys[2]
