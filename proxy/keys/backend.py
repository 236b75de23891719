"""What a store of run-time keys offers (``store.RuntimeKeys`` uses it), and what it
answers: Redis (``redis_backend.py``, shared) or this process (``memory_backend.py``).
*pure*

A shared store has an *epoch*: an id written when the store is first used. Every read
returns it and every write names the epoch it expects, so a store that lost its data (a
restart without persistence, a failover to an empty replica, FLUSHALL) is told apart
from one that merely holds no keys: its epoch is gone, or is another one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.keys.records import KeyRecord

__all__ = ["Changes", "KeyBackend", "Snapshot", "WriteRefused", "WriteUnknown"]


@dataclass(slots=True)
class Snapshot:
    """Everything a store holds: its epoch, a version the records are at least as new
    as, the records, and the names revoked lately with when (Unix seconds)."""

    epoch: str
    version: int
    records: list[KeyRecord]
    revoked: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Changes:
    """What changed since a version: the store's epoch and version now, and for each
    name changed its record (None: revoked, then ``revoked_at`` if known); ``changed``
    None: too far behind the change log, read everything again."""

    epoch: str
    version: int
    changed: list[tuple[str, KeyRecord | None, float | None]] | None


class WriteRefused(Exception):
    """The write did not happen: ``reason`` is ``exists``, ``missing``, ``changed`` (the
    record is not the one expected), ``revoked`` (a delete of a name revoked at
    ``revoked_at``) or ``epoch`` (the store is not the one this process read: it lost
    its data)."""

    def __init__(self, reason: str, revoked_at: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.revoked_at = revoked_at


class WriteUnknown(Exception):
    """The write was sent and its answer never came (a timeout, a connection lost after
    sending): it may have happened or not."""


class KeyBackend(Protocol):
    async def load_all(self) -> Snapshot: ...
    async def changes(self, seen: int) -> Changes: ...
    async def get(self, name: str) -> tuple[KeyRecord, bytes] | None: ...
    # A write names the epoch it expects and returns the store's epoch after it (the
    # first write of a store, expecting "", creates it).
    async def create(self, record: KeyRecord, epoch: str) -> str: ...
    async def update(self, record: KeyRecord, expected: bytes, epoch: str) -> str: ...
    async def delete(self, name: str, epoch: str, at: float) -> str: ...
    async def merge(
        self, records: Sequence[KeyRecord], revoked: Sequence[tuple[str, float]], epoch: str
    ) -> tuple[str, int]: ...
    async def aclose(self) -> None: ...
