"""The run-time key index (pure): a secret's digest to its key, an expiry and a rotation's
grace judged at an injected time, changes applied one record at a time."""

from __future__ import annotations

import pytest

from proxy.errors import AuthenticationFailed
from proxy.keys.index import KeyIndex
from proxy.keys.records import KeyRecord, digest_of

T0 = 1_700_000_000.0


def record(name: str, secret: str, **fields: object) -> KeyRecord:
    return KeyRecord(name, {"rpm": 10}, digest_of(secret), T0, T0, **fields)  # type: ignore[arg-type]


def test_a_secret_finds_its_key_and_its_limits() -> None:
    index = KeyIndex()
    index.apply("svc", record("svc", "s1"))
    found = index.find(digest_of("s1"), T0)
    assert found is not None
    key, limits = found
    assert key.name == "svc" and limits.name == "svc"
    assert [w.name for w in limits.windows] == ["rpm"]
    assert index.find(digest_of("s2"), T0) is None


def test_an_expired_key_is_refused_saying_so() -> None:
    index = KeyIndex()
    index.apply("svc", record("svc", "s1", expires_at=T0 + 60))
    assert index.find(digest_of("s1"), T0 + 59.9) is not None
    with pytest.raises(AuthenticationFailed) as refused:
        index.find(digest_of("s1"), T0 + 60)
    assert refused.value.code == "expired_api_key"


def test_a_rotated_secret_works_until_its_grace_ends() -> None:
    index = KeyIndex()
    index.apply("svc", record("svc", "old"))
    index.apply("svc", record("svc", "old").rotated("new", grace=30, now=T0))
    assert index.find(digest_of("new"), T0 + 100) is not None
    assert index.find(digest_of("old"), T0 + 29.9) is not None
    with pytest.raises(AuthenticationFailed):
        index.find(digest_of("old"), T0 + 30)


def test_a_rotation_without_grace_forgets_the_old_secret() -> None:
    index = KeyIndex()
    index.apply("svc", record("svc", "old").rotated("new", grace=0, now=T0))
    assert index.find(digest_of("old"), T0) is None


def test_a_revoked_key_leaves_no_digest_behind_and_the_listing_follows() -> None:
    index = KeyIndex()
    for name in ("b", "a", "c"):
        index.apply(name, record(name, name))
    assert index.names() == ["a", "b", "c"]
    index.apply("b", None)
    assert index.names() == ["a", "c"] and len(index) == 2
    assert index.find(digest_of("b"), T0) is None


def test_a_newer_index_tells_which_keys_went() -> None:
    older, newer = KeyIndex(), KeyIndex()
    for name in ("a", "b", "c"):
        older.apply(name, record(name, name))
    for name in ("c", "d"):
        newer.apply(name, record(name, name))
    assert sorted(older.missing_from(newer)) == ["a", "b"]
    assert newer.missing_from(older) == ["d"]


def test_a_record_survives_its_json() -> None:
    original = record("svc", "s1", expires_at=T0 + 5).rotated("s2", grace=10, now=T0)
    again = KeyRecord.from_json(original.to_json())
    assert again == original
    assert "s1" not in original.to_json().decode() and "s2" not in original.to_json().decode()
