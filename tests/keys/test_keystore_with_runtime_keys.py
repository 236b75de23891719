"""The pipeline's ``KeyStore`` with keys of the admin API beside the config's (pure, an
injected clock): API keys authenticate with their own limits, config keys win on a name
clash, and without config keys the proxy is open only while no API key exists."""

from __future__ import annotations

import pytest

from proxy.config.settings import ClientKey
from proxy.errors import AuthenticationFailed
from proxy.keys.memory_backend import MemoryKeyBackend
from proxy.keys.store import RuntimeKeys
from proxy.pipeline.auth import KeyStore

NOW = 1_700_000_000.0


def runtime() -> RuntimeKeys:
    return RuntimeKeys(MemoryKeyBackend(), shared=False, clock=lambda: NOW)


async def test_an_api_key_authenticates_with_its_own_limits() -> None:
    keys = runtime()
    _, secret = await keys.create("svc", {"rpm": 3, "priority": 2}, None)
    store = KeyStore([ClientKey(name="cfg", key="sk-cfg", rpm=100)], keys)
    key = store.authenticate(f"Bearer {secret}")
    assert key is not None and key.name == "svc" and key.priority == 2
    limits = store.limits(key, {})
    assert limits is not None and [w.name for w in limits.windows] == ["rpm"]


async def test_a_key_revoked_after_it_authenticated_is_still_charged_its_limits() -> None:
    """The endpoint authenticates from the headers, the pipeline asks the limits once the
    body is in: a revocation between the two must not let that request go unlimited."""
    keys = runtime()
    _, secret = await keys.create("svc", {"rpm": 3}, None)
    store = KeyStore([ClientKey(name="cfg", key="sk-cfg")], keys)
    key = store.authenticate(f"Bearer {secret}")
    assert key is not None
    await keys.revoke("svc")
    limits = store.limits(key, {})
    assert limits is not None and limits.name == "svc"
    assert [(w.name, w.rate.limit) for w in limits.windows] == [("rpm", 3)]


async def test_a_config_key_of_the_same_name_wins() -> None:
    keys = runtime()
    _, secret = await keys.create("team", {}, None)
    store = KeyStore([ClientKey(name="team", key="sk-cfg")], keys)
    with pytest.raises(AuthenticationFailed):
        store.authenticate(f"Bearer {secret}")
    assert store.authenticate("Bearer sk-cfg") is not None


async def test_without_config_keys_the_first_api_key_ends_open_access() -> None:
    keys = runtime()
    store = KeyStore([], keys)
    assert store.open_access and store.authenticate(None) is None
    await keys.create("svc", {}, None)
    assert not store.open_access
    with pytest.raises(AuthenticationFailed):
        store.authenticate(None)
    await keys.revoke("svc")
    assert store.open_access


async def test_a_revoked_key_is_told_to_whoever_built_something_for_it() -> None:
    keys = runtime()
    heard: list[str] = []
    keys.on_gone = heard.append
    await keys.create("svc", {"rpm": 3}, None)
    await keys.revoke("svc")
    assert heard == ["svc"]
