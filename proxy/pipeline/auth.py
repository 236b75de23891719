"""Client key authentication (pure): which configured key, if any, a request presents."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, Protocol

from proxy.config.keys import ConfigKeys
from proxy.config.settings import ClientKey, Settings
from proxy.errors import AuthenticationFailed, ModelNotAllowed, ProxyError
from proxy.limiter.base import KeyLimits
from proxy.shapes.base import ClientCredential
from proxy.shapes.credentials import BEARER, bearer_secret

__all__ = ["KeyStore", "RuntimeLookup", "bearer_matches", "open_when_empty"]


class RuntimeLookup(Protocol):
    """The keys created through the admin API (``proxy/keys/store.RuntimeKeys``);
    ``on_gone`` hears the name of each key it no longer has. ``known``: its store has
    been read (what it holds is known); ``current``: and no read has failed since;
    ``can_hold_keys``: keys can be created in it at all."""

    on_gone: Callable[[str], None]

    @property
    def known(self) -> bool: ...
    @property
    def current(self) -> bool: ...
    @property
    def can_hold_keys(self) -> bool: ...

    def find(self, sha256: str) -> tuple[ClientKey, KeyLimits] | None: ...
    def limits_of(self, key: ClientKey) -> KeyLimits: ...
    def unavailable(self) -> ProxyError: ...
    def __len__(self) -> int: ...


def open_when_empty(settings: Settings) -> bool:
    """Whether no client key at all may mean open access: the admin key API is off (no
    ``admin.keys``: keys cannot be created at run time), or the file says so
    (``server.open_access: true``). Otherwise the keys live in the admin API's store, and
    an empty store (a fresh one, or one that lost its data) must not open the proxy."""
    return settings.server.open_access or not settings.admin.secrets()


class KeyStore:
    """Looks up client keys by the sha256 of the presented secret.

    The secret is hashed before any comparison, so lookup time depends on its digest,
    never on how many leading characters of a real key were guessed; the final check
    uses ``hmac.compare_digest`` as well. Config may hold plain keys or their sha256.
    ``runtime``: the keys of the admin API, asked after the config's, which win on a name
    clash.

    Access is open (no key asked for) only when the config has no client keys, the admin
    API's store has been read and holds none, and either it cannot hold any (no such
    store, or several workers without Redis) or ``open_when_empty`` (see the function of
    that name). Whether Redis answers never opens it: while the store has not been read, a
    request no config key authenticates gets 503 ``key_store_unavailable``, and while it
    does not answer, so does a key this process never saw.
    """

    def __init__(
        self,
        keys: Sequence[ClientKey],
        runtime: RuntimeLookup | None = None,
        *,
        open_when_empty: bool = True,
    ) -> None:
        # Digests to positions: a key's model is built when it is first presented.
        self._keys = ConfigKeys.of(keys)
        # Read on every request: kept here (attributes, not calls).
        self._digests = self._keys.digests()
        self._configured = bool(self._digests)
        self._by_digest = dict(zip(self._digests, range(len(self._digests)), strict=True))
        self._open_when_empty = open_when_empty
        self.runtime = runtime

    def held(self) -> list[object]:
        """Its index (a retired store's is freed off the event loop: release.py)."""
        return [self._by_digest]

    @property
    def open_access(self) -> bool:
        if self._configured:
            return False
        runtime = self.runtime
        if runtime is None:
            return True
        if not runtime.known or len(runtime):
            return False
        return self._open_when_empty or not runtime.can_hold_keys

    def authenticate(
        self,
        presented: str | None,
        credential: ClientCredential = BEARER,
        header: str = "authorization",
    ) -> ClientKey | None:
        """The key behind the value ``presented`` of ``header`` (``credential``: the API
        shape's scheme, ``Authorization: Bearer KEY`` by default); ``None`` in open
        access."""
        if self.open_access:
            return None
        runtime = self.runtime
        secret = credential.secret(header, presented)
        if secret is None:
            self._refuse_missing(credential)
        digest = hashlib.sha256(secret.encode()).digest()
        found = self._by_digest.get(digest)
        if found is None and runtime is not None:
            created = self._created_key(runtime, digest)
            if created is not None:
                return created
        if found is None or not hmac.compare_digest(self._digests[found], digest):
            raise AuthenticationFailed("Incorrect API key provided.")
        return self._keys[found]

    def _refuse_missing(self, credential: ClientCredential) -> NoReturn:
        """No key presented: a 401, unless the store was never read and the file has no
        keys, when whether access is open is not known yet."""
        runtime = self.runtime
        if runtime is not None and not runtime.known and not self._configured:
            raise runtime.unavailable()  # open or not: unknown until the store is read
        raise AuthenticationFailed(credential.missing, code="missing_api_key")

    def _created_key(self, runtime: RuntimeLookup, digest: bytes) -> ClientKey | None:
        """The key created through the admin API with this digest (not one named as a
        file's key); None if there is none, unless the store may have it but cannot
        say now."""
        created = runtime.find(digest.hex())
        if created is not None and self._keys.position(created[0].name) is None:
            return created[0]
        if created is None and not runtime.current and self._unsure(runtime):
            raise runtime.unavailable()  # a key created meanwhile is not known here
        return None

    def _unsure(self, runtime: RuntimeLookup) -> bool:
        """Whether a key the store's last view lacks may still be one of its own: the
        store was never read, or it holds keys, or it holds every key (none in the file).
        A store read empty beside the file's keys: a stranger's key is a 401, as ever."""
        return not runtime.known or len(runtime) > 0 or not self._configured

    def limits(
        self, key: ClientKey | None, configured: Mapping[str, KeyLimits]
    ) -> KeyLimits | None:
        """``key``'s limits: the catalog's for a config key, the record's for an API key
        (``authenticate`` found it: not looked up again, so a key revoked while its
        request's body arrives is still charged)."""
        if key is None:
            return None
        limits = configured.get(key.name)
        if limits is None and self.runtime is not None and self._keys.position(key.name) is None:
            limits = self.runtime.limits_of(key)
        return limits

    @staticmethod
    def authorize(key: ClientKey | None, model: str) -> None:
        """Raise unless ``key`` may use ``model``."""
        if key is not None and key.models is not None and model not in key.models:
            raise ModelNotAllowed(
                f"The key '{key.name}' is not allowed to use the model '{model}'.",
                param="model",
            )


def bearer_matches(
    authorization: str | None, secrets: Sequence[str], *, basic: bool = False
) -> bool:
    """Whether ``Authorization: Bearer X`` presents one of ``secrets`` (an operator's token:
    /metrics, /admin); with ``basic``, ``Basic`` credentials whose password is one of them
    count too (what a browser sends after its login prompt). Digests are compared, every
    one of them, in constant time."""
    presented = bearer_secret(authorization)
    if presented is None and basic:
        presented = _basic_password(authorization)
    given = hashlib.sha256((presented or "").encode()).digest()
    found = False
    for secret in secrets:
        found |= hmac.compare_digest(given, hashlib.sha256(secret.encode()).digest())
    return found and presented is not None


def _basic_password(authorization: str | None) -> str | None:
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    password = decoded.partition(":")[2]
    return password or None
