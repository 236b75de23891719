"""One client key created through the admin API, as stored (*pure*).

A record never holds a secret: only its sha256 (and, while a rotation's grace period
lasts, the previous secret's). The entry's fields are those of a config key
(``config.ClientKey``) and are validated by that same model, so an API key and a config
key accept exactly the same limits.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Container
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from proxy.catalog.catalog import key_limits
from proxy.config.settings import ClientKey, Team, parse_duration
from proxy.errors import InvalidRequest
from proxy.keys.backend import Kind
from proxy.limiter.base import KeyLimits

__all__ = [
    "KEYS",
    "NOT_YET_SUPPORTED",
    "KeyRecord",
    "new_key_id",
    "new_secret",
    "parse_expiry",
    "parse_grace",
    "rfc3339",
    "validate_entry",
    "validated",
]

# Fields of the contract's key entry that another issue adds: refused by name until
# then, rather than accepted and silently ignored (none now: teams and budgets are in).
NOT_YET_SUPPORTED: tuple[str, ...] = ()
# The secret is the client's: neither sent to the API nor changed by a PATCH.
_SECRET_FIELDS = ("key", "key_sha256")
# What the API adds to a config entry.
_API_FIELDS = ("expires_at",)
_MAX_GRACE = 30 * 86400.0  # a rotation's old secret works at most 30 days
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@-")
_MAX_NAME = 128


def new_secret() -> str:
    """A fresh client key: 256 random bits, URL-safe, recognisable by its prefix."""
    return "sk-llmp-" + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """An API key's identity (``ClientKey.identity``): 128 random bits, made with its
    record and kept by its rotations and changes; a key created again under a revoked
    one's name gets its own."""
    return "key_" + secrets.token_hex(16)


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(slots=True)
class KeyRecord:
    """``spec``: the config entry's fields without the name and secret (validated);
    ``sha256``: the secret's digest; ``previous_sha256`` works until ``previous_until``
    (a rotation's grace); times are Unix seconds. ``key_id``: the key's identity
    (``new_key_id``); None in a record stored before keys had one: its name is then (what
    its stored responses were kept under)."""

    name: str
    spec: dict[str, Any]
    sha256: str
    created_at: float
    updated_at: float
    expires_at: float | None = None
    previous_sha256: str | None = None
    previous_until: float | None = None
    key_id: str | None = None
    _built: tuple[ClientKey, KeyLimits] | None = field(default=None, repr=False, compare=False)

    def client_key(self) -> tuple[ClientKey, KeyLimits]:
        """The key as the pipeline uses it, built on first use (a store of 100,000 keys
        never validates those nobody presents)."""
        if self._built is None:
            key = ClientKey.model_validate(
                {**self.spec, "name": self.name, "key_sha256": self.sha256}
            )
            if self.key_id is not None:
                key.identified_as(self.key_id)
            self._built = (key, key_limits(key))
        return self._built

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def accepts(self, sha256: str, now: float) -> bool:
        """Whether the secret of digest ``sha256`` opens this key at ``now``."""
        if self.expired(now):
            return False
        if sha256 == self.sha256:
            return True
        return (
            sha256 == self.previous_sha256
            and self.previous_until is not None
            and now < self.previous_until
        )

    def digests(self) -> tuple[str, ...]:
        return (
            (self.sha256,) if self.previous_sha256 is None else (self.sha256, self.previous_sha256)
        )

    def rotated(self, secret: str, grace: float, now: float) -> KeyRecord:
        return replace(
            self,
            sha256=digest_of(secret),
            previous_sha256=self.sha256 if grace > 0 else None,
            previous_until=now + grace if grace > 0 else None,
            updated_at=now,
            _built=None,
        )

    def changed(self, spec: dict[str, Any], expires_at: float | None, now: float) -> KeyRecord:
        return replace(self, spec=spec, expires_at=expires_at, updated_at=now, _built=None)

    def public(self, now: float) -> dict[str, Any]:
        """The entry as the API lists it: no secret, no digest."""
        entry: dict[str, Any] = {"name": self.name, **self.spec, "source": "api"}
        entry["created_at"] = rfc3339(self.created_at)
        entry["expires_at"] = rfc3339(self.expires_at) if self.expires_at is not None else None
        entry["expired"] = self.expired(now)
        if self.previous_until is not None and now < self.previous_until:
            entry["previous_key_valid_until"] = rfc3339(self.previous_until)
        return entry

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "name": self.name,
                "spec": self.spec,
                "sha256": self.sha256,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "expires_at": self.expires_at,
                "previous_sha256": self.previous_sha256,
                "previous_until": self.previous_until,
                "key_id": self.key_id,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> KeyRecord:
        data = orjson.loads(raw)
        return cls(
            name=data["name"],
            spec=data["spec"],
            sha256=data["sha256"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            expires_at=data.get("expires_at"),
            previous_sha256=data.get("previous_sha256"),
            previous_until=data.get("previous_until"),
            key_id=data.get("key_id"),
        )


KEYS: Kind[KeyRecord] = Kind(
    noun="key",
    label="run-time client keys",
    tag="apikeys",
    decode=KeyRecord.from_json,
    path="/admin/keys",
    gone="revoked",
    retry_says={
        "create": "a retry answers 409 key_exists if it was (rotate the key for a secret:"
        " POST /admin/keys/{name}/rotate)",
        "update": "retrying the same change is safe",
        "rotate": "a retry rotates it again and answers the secret in force (that of an"
        " attempt which happened is never shown, and the grace then runs from the retry)",
        "revoke": "a retry answers 204, or 404 key_revoked if it was",
    },
    exists_note=" (if an earlier create of it answered that its outcome is unknown, it"
    " happened: rotate the key for a secret)",
)


def validate_entry(
    body: object,
    *,
    name: str | None,
    models: frozenset[str],
    teams: Container[str] = frozenset(),
) -> tuple[str, dict[str, Any], float | None, set[str]]:
    """A key entry sent to the API: its name, its fields (validated as a config key's),
    its expiry and which fields it gave. ``name``: the one in the path (a PATCH), which the
    body may not change; ``models``: the configured groups an allow-list or a window's
    ``models`` may name; ``teams``: the teams (the config's and the API's) ``team`` may
    name. Raises ``InvalidRequest`` naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object: a key entry.")
    for secret_field in _SECRET_FIELDS:
        if secret_field in body:
            raise InvalidRequest(
                f"'{secret_field}' cannot be sent: the proxy makes the secret and returns it"
                " once (POST /admin/keys, or .../rotate).",
                param=secret_field,
            )
    for later in NOT_YET_SUPPORTED:
        if later in body:
            raise InvalidRequest(
                f"'{later}' is not supported yet on keys.", param=later, code="not_supported_yet"
            )
    given = set(body)
    fields = {k: v for k, v in body.items() if k not in _API_FIELDS}
    name = entry_name(fields, name, "key")
    checked = validated(ClientKey, {**fields, "name": name, "key_sha256": "0" * 64}, "key")
    check_models(checked, models)
    if checked.team is not None and checked.team not in teams:
        raise InvalidRequest(
            f"'team' names no team (of the config or the API): {checked.team}.", param="team"
        )
    expiry = parse_expiry(body.get("expires_at")) if "expires_at" in body else None
    return name, fields, expiry, given


_Entry = TypeVar("_Entry", ClientKey, Team)


def entry_name(fields: dict[str, Any], name: str | None, noun: str) -> str:
    """The name of an entry sent to the API, taken out of ``fields``: the body's (a
    create), checked; or ``name``, the path's (a PATCH), which the body may not change."""
    if name is None:
        name = fields.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"A {noun} needs a 'name'.", param="name")
        _check_name(name, noun)
    elif "name" in fields and fields["name"] != name:
        raise InvalidRequest(f"A {noun}'s name cannot be changed.", param="name")
    fields.pop("name", None)
    return name


def validated(model: type[_Entry], fields: dict[str, Any], noun: str) -> _Entry:
    """``fields`` as the config's ``model`` (a key's or a team's entry) validates them;
    the first error as a 400 naming its field."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise InvalidRequest(
            f"Invalid {noun} entry: {param}: {first['msg']}", param=param
        ) from None


def check_models(owner: ClientKey | Team, models: frozenset[str]) -> None:
    """Every model group an entry names (a key's allow-list, a window's or a budget's
    ``models``) is a configured one: a typo must not leave a limit counting nothing."""
    named = [(f"budgets.{i}.models", b.models) for i, b in enumerate(owner.budgets)]
    if isinstance(owner, ClientKey):
        named.insert(0, ("models", owner.models))
    for param, allowed in named:
        unknown = sorted(set(allowed or ()) - models)
        if unknown:
            raise InvalidRequest(
                f"'{param}' names no configured model group: {', '.join(unknown)}.",
                param=param,
            )
    for i, spec in enumerate(owner.limits):
        unknown = sorted(set(spec.models or ()) - models)
        if unknown:
            raise InvalidRequest(
                f"'limits[{i}].models' names no configured model group: {', '.join(unknown)}.",
                param=f"limits.{i}.models",
            )


def parse_expiry(value: object) -> float | None:
    """``expires_at``: RFC 3339 with a time zone, or null (never)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("'expires_at' must be an RFC 3339 time.", param="expires_at")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            "'expires_at' must be an RFC 3339 time, e.g. 2030-01-31T00:00:00Z.",
            param="expires_at",
        ) from None
    if when.tzinfo is None:
        raise InvalidRequest("'expires_at' needs a time zone (Z or +hh:mm).", param="expires_at")
    return when.timestamp()


def parse_grace(body: object) -> float:
    """A rotation's ``{"grace": "1h"}``: how long the old secret keeps working (default 0,
    at most 30 days)."""
    if body is None:
        return 0.0
    if not isinstance(body, dict) or set(body) - {"grace"}:
        raise InvalidRequest('The body may only hold \'grace\', e.g. {"grace": "1h"}.')
    try:
        grace = parse_duration(body.get("grace", 0))
    except (ValueError, TypeError):
        raise InvalidRequest(
            '\'grace\' must be a duration, e.g. "30s" or "1h".', param="grace"
        ) from None
    if not 0 <= grace <= _MAX_GRACE:
        raise InvalidRequest("'grace' must be between 0 and 30 days.", param="grace")
    return grace


def _check_name(name: str, noun: str) -> None:
    if len(name) > _MAX_NAME or not set(name) <= _NAME_CHARS:
        raise InvalidRequest(
            f"A {noun}'s name has at most {_MAX_NAME} characters among letters, digits and"
            " . _ : @ -",
            param="name",
        )


def rfc3339(seconds: float) -> str:
    """Unix seconds as RFC 3339 in UTC (``2030-01-31T00:00:00Z``)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
