"""What a store of named records offers (``store.RecordStore`` uses it: the client keys
of the admin API, its teams), and what it answers: Redis (``redis_backend.py``, shared)
or this process (``memory_backend.py``). *pure*

A record is one entry of a kind (``Kind``: a key, a team) under its name, with the time
it last changed (``updated_at``: the newest of a name wins when copies merge) and its
JSON. A shared store has an *epoch*: an id written when the store is first used. Every
read returns it and every write names the epoch it expects, so a store that lost its data
(a restart without persistence, a failover to an empty replica, FLUSHALL) is told apart
from one that merely holds no records: its epoch is gone, or is another one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = [
    "Changes",
    "Kind",
    "RecordBackend",
    "Snapshot",
    "StoredRecord",
    "WriteRefused",
    "WriteUnknown",
]


class StoredRecord(Protocol):
    """What a store needs of a record: its name, when it last changed, its JSON."""

    @property
    def name(self) -> str: ...
    @property
    def updated_at(self) -> float: ...
    def to_json(self) -> bytes: ...


R = TypeVar("R", bound=StoredRecord)


@dataclass(frozen=True, slots=True)
class Kind(Generic[R]):
    """What one store holds. ``noun``: a record, in messages and error codes (``key``:
    ``key_not_found``, ``key_exists``); ``label``: the store, in log lines (``run-time
    client keys``); ``tag``: its Redis hash tag (``apikeys``: ``llmproxy:{apikeys}:*``);
    ``decode``: a record from its JSON; ``path``: its admin API; ``gone``: what a
    delete did (``revoked``: a retried delete answers 404 ``key_revoked``);
    ``retry_says``: per write, what a retry of one whose outcome is unknown answers;
    ``exists_note``: said beside a create's 409."""

    noun: str
    label: str
    tag: str
    decode: Callable[[bytes | str], R]
    path: str
    gone: str = "deleted"
    retry_says: Mapping[str, str] = field(default_factory=dict)
    exists_note: str = ""


@dataclass(slots=True)
class Snapshot(Generic[R]):
    """Everything a store holds: its epoch, a version the records are at least as new
    as, the records, and the names deleted lately with when (Unix seconds)."""

    epoch: str
    version: int
    records: list[R]
    revoked: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Changes(Generic[R]):
    """What changed since a version: the store's epoch and version now, and for each
    name changed its record (None: deleted, then ``revoked_at`` if known); ``changed``
    None: too far behind the change log, read everything again."""

    epoch: str
    version: int
    changed: list[tuple[str, R | None, float | None]] | None


class WriteRefused(Exception):
    """The write did not happen: ``reason`` is ``exists``, ``missing``, ``changed`` (the
    record is not the one expected), ``revoked`` (a delete of a name deleted at
    ``revoked_at``) or ``epoch`` (the store is not the one this process read: it lost
    its data)."""

    def __init__(self, reason: str, revoked_at: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.revoked_at = revoked_at


class WriteUnknown(Exception):
    """The write was sent and its answer never came (a timeout, a connection lost after
    sending): it may have happened or not."""


class RecordBackend(Protocol[R]):
    async def load_all(self) -> Snapshot[R]: ...
    async def changes(self, seen: int) -> Changes[R]: ...
    async def get(self, name: str) -> tuple[R, bytes] | None: ...
    # A write names the epoch it expects and returns the store's epoch after it (the
    # first write of a store, expecting "", creates it).
    async def create(self, record: R, epoch: str) -> str: ...
    async def update(self, record: R, expected: bytes, epoch: str) -> str: ...
    async def delete(self, name: str, epoch: str, at: float) -> str: ...
    async def merge(
        self, records: Sequence[R], revoked: Sequence[tuple[str, float]], epoch: str
    ) -> tuple[str, int]: ...
    async def aclose(self) -> None: ...
