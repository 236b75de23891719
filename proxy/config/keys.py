"""The config's client keys, checked cheaply when the file is read and each built on
first use (*pure*).

A config of 100,000 keys spent most of its start-up making a pydantic model of every
key. Here an entry of only the plain fields (``PLAIN_FIELDS``: a name, a secret or its
sha256, the rpm/tpm/rpd/tpd shorthands, a team, an allow-list, priority and weight),
each of exactly the type it must be, is checked by ``plain_digest`` (a few type tests)
and kept as it is; its ``ClientKey`` is made when something first asks for it (a
request presenting it, the admin page listing it). Such an entry is valid by
construction: whatever ``plain_digest`` accepts, ``ClientKey`` accepts too (a property
test says so). Any other entry (budgets, ``limits``, shadow, a number given as a
string...) is validated in full when the file is read, as before, with pydantic's
errors. Names, digests and the index by name are ready from the start: what
authentication and paging need are dict lookups.
"""

from __future__ import annotations

import hashlib
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

__all__ = ["PLAIN_FIELDS", "ConfigKeys", "Key", "KeysBuilder", "plain_digest"]


class Key(Protocol):
    """What this reads of a key (``settings.ClientKey``, which it builds through the
    ``make`` it is given: this module knows no model)."""

    @property
    def name(self) -> str: ...

    @property
    def team(self) -> str | None: ...

    def digest(self) -> bytes: ...


K = TypeVar("K", bound=Key)
Make = Callable[[dict[str, Any]], K]

_WINDOWS = ("rpm", "tpm", "rpd", "tpd")
PLAIN_FIELDS = frozenset(
    ("name", "key", "key_sha256", "team", "models", "priority", "weight", *_WINDOWS)
)
_BASIC_FIELDS = frozenset(("name", "key", "key_sha256", *_WINDOWS))
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def plain_digest(entry: object) -> bytes | None:
    """The sha256 of a plain key entry's secret; None if the entry is not plain (it may
    still be valid: pydantic decides). Exact types only: a bool is not a number here,
    nor ``"60"`` an int."""
    if type(entry) is not dict or not entry.keys() <= PLAIN_FIELDS:
        return None
    name = entry.get("name")
    if type(name) is not str or not name:
        return None
    if not _plain_windows(entry):
        return None
    if not entry.keys() <= _BASIC_FIELDS and not _plain_extras(entry):
        return None
    return _secret_digest(entry.get("key"), entry.get("key_sha256"))


def _plain_windows(entry: dict[str, Any]) -> bool:
    """Each of the rpm/tpm/rpd/tpd shorthands absent or a positive int (not a bool)."""
    for field in _WINDOWS:
        amount = entry.get(field)
        if amount is not None and (type(amount) is not int or amount <= 0):
            return False
    return True


def _secret_digest(key: object, sha256: object) -> bytes | None:
    """The digest of the one secret given: a non-empty ``key``, or alone a ``key_sha256``
    of 64 hex digits; None for anything else (pydantic words the problem)."""
    if sha256 is None:
        return _key_digest(key)
    if key is None and type(sha256) is str and _HEX64.fullmatch(sha256):
        return bytes.fromhex(sha256)
    return None


def _key_digest(key: object) -> bytes | None:
    """The sha256 of a non-empty string key; None otherwise."""
    if type(key) is not str or not key:
        return None
    try:
        return hashlib.sha256(key.encode()).digest()
    except UnicodeEncodeError:  # a lone surrogate: pydantic words the problem
        return None


def _plain_extras(entry: dict[str, Any]) -> bool:
    """The fields beyond a name, a secret and two windows, each of its exact type."""
    team, models = entry.get("team"), entry.get("models")
    if team is not None and (type(team) is not str or not team):
        return False
    if models is not None and not _strings(models):
        return False
    if "priority" in entry and type(entry["priority"]) is not int:
        return False
    return "weight" not in entry or _positive_number(entry["weight"])


def _strings(value: object) -> bool:
    """Whether ``value`` is a list of strings only (an allow-list)."""
    return type(value) is list and all(type(m) is str for m in value)


def _positive_number(value: object) -> bool:
    """Whether ``value`` is an int or a float (not a bool) above 0 (not NaN)."""
    return (type(value) is int or type(value) is float) and value > 0


class ConfigKeys(Sequence[K]):
    """The client keys of one config, in file order; ``keys[i]`` builds key ``i`` on
    first use. ``full()`` are the keys validated in full when the file was read: every
    key with budgets, ``limits``, ``max_parallel``, ``max_wait`` or ``shadow`` is among
    them (a plain entry has none of these)."""

    __slots__ = ("_built", "_digests", "_entries", "_full", "_index", "_make", "_names")

    def __init__(
        self,
        names: list[str],
        digests: list[bytes],
        entries: list[dict[str, Any] | None],
        built: list[K | None],
        full: list[K],
        make: Make[K],
    ) -> None:
        self._names = names
        self._digests = digests
        self._entries = entries  # a plain entry, or None: built already
        self._built = built
        self._index = dict(zip(names, range(len(names)), strict=True))
        self._full = full  # validated in full (or made in code): the others are plain
        self._make = make  # a plain entry's key, on first use

    @classmethod
    def of(cls, keys: Sequence[K]) -> ConfigKeys[K]:
        """Keys already validated (made in code, a test's)."""
        if isinstance(keys, ConfigKeys):
            return keys
        listed = list(keys)
        return ConfigKeys(
            [k.name for k in listed],
            [k.digest() for k in listed],
            [None] * len(listed),
            list(listed),
            listed,
            _built_already,
        )

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, index: int) -> K: ...
    @overload
    def __getitem__(self, index: slice) -> list[K]: ...
    def __getitem__(self, index: int | slice) -> K | list[K]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        key = self._built[index]
        if key is None:
            entry = self._entries[index]
            assert entry is not None  # a slot without an entry was built when it was read
            key = self._built[index] = self._make(entry)
        return key

    def __iter__(self) -> Iterator[K]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compared by value: unhashable

    def __repr__(self) -> str:
        return f"ConfigKeys({len(self)} keys)"

    def names(self) -> list[str]:
        """Every key's name, in file order (not to be changed)."""
        return self._names

    def digests(self) -> list[bytes]:
        """Every key's sha256, in file order (not to be changed)."""
        return self._digests

    def position(self, name: str) -> int | None:
        return self._index.get(name)

    def by_name(self) -> Mapping[str, int]:
        """Names to positions, in file order (not to be changed)."""
        return self._index

    def team_of(self, position: int) -> str | None:
        """The team of the key at ``position``, without building it."""
        entry = self._entries[position]
        return self[position].team if entry is None else entry.get("team")

    def get(self, name: str) -> K | None:
        """The key named ``name``, built if it was not yet."""
        i = self._index.get(name)
        return None if i is None else self[i]

    def same_as(self, position: int, other: ConfigKeys[K], at: int) -> bool:
        """Whether the key at ``position`` is ``other``'s at ``at``: two plain entries
        are compared as read (neither is built), anything else as keys."""
        mine, theirs = self._entries[position], other._entries[at]
        if mine is not None and theirs is not None:
            return mine == theirs
        return self[position] == other[at]

    def full(self) -> list[K]:
        """The keys validated in full when the file was read (see the class)."""
        return self._full

    def entry(self, name: str) -> dict[str, Any] | None:
        """The plain entry of ``name`` as read (None: not plain, or no such key)."""
        i = self._index.get(name)
        return None if i is None else self._entries[i]

    def held(self) -> list[object]:
        """What this holds, for ``release.release_in_slices`` (a reload's retired keys)."""
        return [*self._built, *self._entries, *self._digests, self._index]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """In a pydantic model (as ``ConfigKeys[Model]``): validated as a list of the
        model (their errors at their place), kept as ``ConfigKeys``; dumped as that list."""
        from pydantic_core import core_schema

        (model,) = typing.get_args(source)
        listed: Any = list  # of the model the annotation names

        def validate(value: Any, inner: Any) -> ConfigKeys[Any]:
            return value if isinstance(value, ConfigKeys) else cls.of(inner(value))

        return core_schema.no_info_wrap_validator_function(
            validate,
            handler.generate_schema(listed[model]),
            serialization=core_schema.plain_serializer_function_ser_schema(list),
        )


class KeysBuilder(typing.Generic[K]):
    """Collects a config's keys in file order (``parse_settings``); ``previous``: the
    keys in force (a reload), whose key is kept for an entry that did not change;
    ``make``: a plain entry's key, when it is first used."""

    def __init__(self, make: Make[K], previous: Sequence[K] | None = None) -> None:
        self._make = make
        self._previous = previous if isinstance(previous, ConfigKeys) else None
        self._names: list[str] = []
        self._digests: list[bytes] = []
        self._entries: list[dict[str, Any] | None] = []
        self._built: list[K | None] = []
        self._full: list[K] = []

    def plain(self, entry: dict[str, Any], digest: bytes) -> None:
        name: str = entry["name"]
        built: K | None = None
        previous = self._previous
        if previous is not None and (i := previous.position(name)) is not None:
            before = previous._entries[i]
            # Plain entries are of exact types: equal entries validate alike.
            if before is not None and before == entry:
                built, entry = previous._built[i], before
        self._names.append(name)
        self._digests.append(digest)
        self._entries.append(entry)
        self._built.append(built)

    def validated(self, key: K) -> None:
        self._names.append(key.name)
        self._digests.append(key.digest())
        self._entries.append(None)
        self._built.append(key)
        self._full.append(key)

    def done(self) -> ConfigKeys[K]:
        return ConfigKeys(
            self._names, self._digests, self._entries, self._built, self._full, self._make
        )


def _built_already(entry: dict[str, Any]) -> Any:
    """``make`` of keys made in code: every one is built, none is made from an entry."""
    raise AssertionError("keys made in code have no plain entry")
