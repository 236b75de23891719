"""The config's client keys: a plain entry is checked by its types and built on first
use; whatever the cheap check accepts, the full validation accepts alike; a bad entry
still fails the start with its field named."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from proxy.config.keys import PLAIN_FIELDS, ConfigKeys, plain_digest
from proxy.config.settings import ClientKey, ConfigError, parse_settings

MODELS = [{"name": "m", "deployments": [{"id": "a", "base_url": "http://u/v1"}]}]


def _settings(keys: list[Any], **sections: Any) -> Any:
    return parse_settings({"keys": keys, "models": MODELS, **sections}, env={})


def _problems(keys: list[Any], **sections: Any) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        _settings(keys, **sections)
    return exc.value.problems


# Values of every type YAML gives, and some of each field's edge cases.
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "k", "sk-1", "60", "a" * 64, "A" * 64, "g" * 64, "1.5"]),
    st.lists(st.sampled_from(["m", "", "x"]), max_size=2),
    st.lists(st.integers(), max_size=1),
    st.dictionaries(st.just("a"), st.integers(), max_size=1),
)


@pytest.mark.slow
@given(
    st.dictionaries(
        st.sampled_from(sorted(PLAIN_FIELDS | {"shadow", "budgets"})), _VALUES, max_size=6
    ),
    st.sampled_from(["name", "key", "key_sha256", None]),
)
def test_what_the_cheap_check_accepts_the_full_validation_accepts_alike(
    entry: dict[str, Any], required: str | None
) -> None:
    if required == "name":
        entry.setdefault("name", "k")
    elif required is not None:
        entry.setdefault("name", "k")
        entry.setdefault(required, "sk-1" if required == "key" else "a" * 64)
    digest = plain_digest(entry)
    if digest is None:
        return
    key = ClientKey.model_validate(entry)  # raises if the check let a bad entry through
    assert key.digest() == digest


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "k", "key": "sk-1", "rpm": 60, "tpm": 1000},
        {"name": "k", "key_sha256": "AB" * 32, "rpd": 5, "team": "t", "models": ["m"]},
        {"name": "k", "key": "sk-1", "priority": -2, "weight": 0.5},
    ],
)
def test_a_plain_entry_passes_the_cheap_check(entry: dict[str, Any]) -> None:
    assert plain_digest(entry) == ClientKey.model_validate(entry).digest()


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "k", "key": "sk-1", "rpm": "60"},  # valid, but a string: pydantic decides
        {"name": "k", "key": "sk-1", "rpm": True},
        {"name": "k", "key": "sk-1", "shadow": False},
        {"name": "k", "key": "sk-1", "budgets": []},
        {"name": "k", "key": "", "key_sha256": "ab" * 32},
        {"name": "k", "key": "sk-1", "weight": float("nan")},
        {"name": "", "key": "sk-1"},
        {"name": "k"},
        {"name": "k", "key": "sk-\ud800"},
        ["not", "a", "mapping"],
    ],
)
def test_anything_else_is_left_to_the_full_validation(entry: object) -> None:
    assert plain_digest(entry) is None


def test_plain_keys_are_built_on_first_use_and_once() -> None:
    settings = _settings([{"name": f"k{i}", "key": f"sk-{i}", "rpm": 60} for i in range(3)])
    keys = settings.keys
    assert isinstance(keys, ConfigKeys)
    assert keys.names() == ["k0", "k1", "k2"]
    assert keys.digests()[1] == hashlib.sha256(b"sk-1").digest()
    assert keys.full() == []
    assert keys[1] is keys.get("k1")
    assert keys[1].rpm == 60
    assert keys.get("nope") is None


def test_keys_with_more_than_the_plain_fields_are_validated_when_read() -> None:
    keys = _settings(
        [
            {"name": "plain", "key": "sk-1"},
            {"name": "shadowed", "key": "sk-2", "rpm": 10, "shadow": True},
            {"name": "budgeted", "key": "sk-3", "budgets": [{"tokens": 5, "period": "day"}]},
        ]
    ).keys
    assert [k.name for k in keys.full()] == ["shadowed", "budgeted"]
    assert keys.team_of(0) is None


def test_a_bad_entry_fails_with_its_field_named_among_many() -> None:
    entries: list[Any] = [{"name": f"k{i}", "key": f"sk-{i}", "rpm": 60} for i in range(500)]
    entries[321]["rpm"] = 0
    entries[400]["key_sha256"] = "nothex"
    problems = _problems(entries)
    assert problems[0] == "keys[321].rpm: must be greater than 0"
    assert problems[1] == "keys[400].key_sha256: must be 64 hex characters (a sha256 digest)"


def test_references_of_plain_keys_are_checked_when_read() -> None:
    problems = _problems(
        [
            {"name": "a", "key": "sk-1", "team": "nope", "models": ["m", "mm"]},
            {"name": "a", "key": "sk-2"},
        ],
        teams=[{"name": "t"}],
    )
    assert "keys: duplicate name 'a'" in problems
    assert "keys[0].team: unknown team 'nope'" in problems
    assert "keys[0].models: unknown model 'mm'; did you mean 'm'?" in problems


def test_keys_made_in_code_are_kept_as_given() -> None:
    made = ClientKey(name="k", key_sha256="ab" * 32)
    keys = ConfigKeys.of([made])
    assert keys[0] is made
    assert keys.full() == [made]
    assert ConfigKeys.of(keys) is keys
    with pytest.raises(ValidationError):
        ClientKey.model_validate({"name": "k"})
