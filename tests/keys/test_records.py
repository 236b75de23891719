"""A key entry sent to the admin API is checked as a config key is, plus what the API adds
(pure): every refusal a 400 naming the field."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import InvalidRequest
from proxy.keys.records import (
    KeyRecord,
    digest_of,
    new_key_id,
    parse_expiry,
    parse_grace,
    validate_entry,
)

MODELS = frozenset({"gpt-4o-mini"})


def test_an_entry_is_checked_as_a_config_key() -> None:
    name, spec, expiry, _ = validate_entry(
        {
            "name": "svc",
            "rpm": 5,
            "limits": [{"tokens": 100, "per": "30d"}],
            "models": ["gpt-4o-mini"],
        },
        name=None,
        models=MODELS,
    )
    assert name == "svc" and expiry is None
    assert spec == {"rpm": 5, "limits": [{"tokens": 100, "per": "30d"}], "models": ["gpt-4o-mini"]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "svc", "team": "x"}, "team"),
        ({"name": "svc", "budgets": [{"usd": 5}]}, "budgets.0.period"),
        (
            {"name": "svc", "budgets": [{"usd": 5, "period": "day", "models": ["x"]}]},
            "budgets.0.models",
        ),
        ({"name": "svc", "key_sha256": "0" * 64}, "key_sha256"),
        ({"name": "svc", "weight": 0}, "weight"),
        ({"name": "svc", "rpm": 5, "limits": [{"requests": 9, "per": "1m"}]}, None),
    ],
)
def test_a_wrong_entry_is_refused(body: dict[str, object], param: str | None) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_entry(body, name=None, models=MODELS)
    assert refused.value.param == param


def test_a_patch_cannot_rename_the_key() -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_entry({"name": "other"}, name="svc", models=MODELS)
    assert refused.value.param == "name"


def test_expiry_is_rfc3339_with_a_zone() -> None:
    assert parse_expiry("1970-01-01T00:01:00Z") == 60.0
    assert parse_expiry(None) is None
    for wrong in ("2030-01-01", "soon", 5):
        with pytest.raises(InvalidRequest):
            parse_expiry(wrong)


@pytest.mark.parametrize("grace", ["-1s", "31d", "nan", "inf", True, "1 hour"])
def test_a_grace_is_a_bounded_duration(grace: object) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_grace({"grace": grace})
    assert refused.value.param == "grace"


def test_a_grace_defaults_to_zero() -> None:
    assert parse_grace(None) == 0.0 and parse_grace({}) == 0.0
    assert parse_grace({"grace": "1h"}) == 3600.0


def test_a_keys_identity_is_its_id_kept_by_rotations_and_changes_and_stored() -> None:
    record = KeyRecord("svc", {"rpm": 10}, digest_of("sk-a"), 1.0, 1.0, key_id=new_key_id())
    key, _ = record.client_key()
    assert key.identity() == record.key_id and key.identity() != "svc"
    rotated = record.rotated("sk-b", grace=0.0, now=2.0)
    changed = rotated.changed({"rpm": 20}, None, now=3.0)
    stored = KeyRecord.from_json(changed.to_json())
    assert [r.client_key()[0].identity() for r in (rotated, changed, stored)] == [
        key.identity()
    ] * 3
    again = KeyRecord("svc", {"rpm": 10}, digest_of("sk-a"), 4.0, 4.0, key_id=new_key_id())
    assert again.client_key()[0].identity() != key.identity()  # the same name: another key


def test_a_record_stored_before_keys_had_ids_is_its_name() -> None:
    old = orjson.loads(KeyRecord("svc", {}, digest_of("sk-a"), 1.0, 1.0).to_json())
    del old["key_id"]
    record = KeyRecord.from_json(orjson.dumps(old))
    assert record.client_key()[0].identity() == "svc"
    assert record.rotated("sk-b", 0.0, 2.0).client_key()[0].identity() == "svc"
