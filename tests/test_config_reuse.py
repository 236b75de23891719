"""A reload's key list: an entry that did not change keeps its validated key
(``parse_settings(previous=...)``); everything else is validated as ever."""

from __future__ import annotations

import math
from typing import Any

import pytest

from proxy.config import ConfigError, Settings, entry_print, parse_settings

KEYS = 250  # over config._KEYS_CHUNK: the long list's path


def _document(keys: list[dict[str, Any]]) -> dict[str, Any]:
    models = [{"name": "m", "deployments": [{"id": "a", "base_url": "http://u/v1"}]}]
    return {"keys": keys, "models": models}


def _keys() -> list[dict[str, Any]]:
    return [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 60} for i in range(KEYS)]


def _first() -> Settings:
    return parse_settings(_document(_keys()), env={})


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
    second = parse_settings(_document(entries), env={"SECRET": "new"}, previous=first)
    assert second.keys[3] is not first.keys[3]
    assert second.keys[3].key is not None
    assert second.keys[3].key.get_secret_value() == "new"
    assert second.keys[4] is first.keys[4]


def test_a_fingerprint_ignores_field_order_and_tells_types_apart() -> None:
    assert entry_print({"name": "a", "rpm": 1}) == entry_print({"rpm": 1, "name": "a"})
    prints = {entry_print({"name": "a", "weight": w}) for w in (1, 1.0, True, "1")}
    assert len(prints) == 4


@pytest.mark.parametrize("value", [None, math.nan, math.inf, 2**70, b"x"])
def test_an_entry_json_cannot_tell_apart_is_never_reused(value: object) -> None:
    assert entry_print({"name": "a", "max_wait": value}) == b""
