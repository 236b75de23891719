"""Client keys: bearer auth against plain or sha256 keys, and model allow-lists."""

import hashlib

import pytest

from proxy.config.settings import ClientKey
from proxy.errors import AuthenticationFailed, ModelNotAllowed
from proxy.pipeline.auth import KeyStore


def _store() -> KeyStore:
    return KeyStore(
        [
            ClientKey(name="plain", key="sk-plain"),
            ClientKey(name="hashed", key_sha256=hashlib.sha256(b"sk-hashed").hexdigest()),
            ClientKey(name="limited", key="sk-limited", models=["a"]),
        ]
    )


def test_plain_and_hashed_keys_authenticate() -> None:
    store = _store()
    assert store.authenticate("Bearer sk-plain").name == "plain"  # type: ignore[union-attr]
    assert store.authenticate("bearer  sk-hashed ").name == "hashed"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Basic sk-plain", "Bearer sk-wrong", "sk-plain"]
)
def test_bad_or_missing_keys_are_401(header: str | None) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        _store().authenticate(header)
    assert info.value.status == 401


def test_no_keys_means_open_access() -> None:
    store = KeyStore([])
    assert store.open_access
    assert store.authenticate(None) is None


def test_model_allow_list() -> None:
    store = _store()
    limited = store.authenticate("Bearer sk-limited")
    store.authorize(limited, "a")
    with pytest.raises(ModelNotAllowed) as info:
        store.authorize(limited, "b")
    assert info.value.status == 403
    store.authorize(store.authenticate("Bearer sk-plain"), "b")


def test_an_operator_token_matches_only_one_of_the_configured_secrets() -> None:
    from proxy.pipeline.auth import bearer_matches

    assert bearer_matches("Bearer adm-1", ["adm-0", "adm-1"])
    assert bearer_matches("bearer  adm-1 ", ["adm-1"])
    assert not bearer_matches("Bearer adm-2", ["adm-0", "adm-1"])
    assert not bearer_matches(None, ["adm-1"])
    assert not bearer_matches("Basic adm-1", ["adm-1"])
    assert not bearer_matches("Bearer ", [""])  # an empty secret never opens the door
    assert not bearer_matches("Bearer x", [])


def test_basic_credentials_count_only_where_asked_for() -> None:
    import base64

    from proxy.pipeline.auth import bearer_matches

    def basic(user_password: str) -> str:
        return "Basic " + base64.b64encode(user_password.encode()).decode()

    assert bearer_matches(basic("anyone:adm-1"), ["adm-1"], basic=True)
    assert not bearer_matches(basic("anyone:adm-1"), ["adm-1"])
    assert not bearer_matches(basic("adm-1:"), ["adm-1"], basic=True)
    assert not bearer_matches("Basic !!not-base64", ["adm-1"], basic=True)
