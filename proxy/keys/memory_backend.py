"""Run-time records (keys, teams) in this process only (no ``redis.url``): lost on
restart, and with ``--workers N`` refused (``store.py``), since each worker would hold
its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic

from proxy.keys.backend import Changes, Kind, R, Snapshot, WriteRefused
from proxy.keys.records import KEYS, KeyRecord

__all__ = ["MemoryBackend", "MemoryKeyBackend"]

EPOCH = "process"  # this process's store lives and dies with it: never lost under it
_KEEP_REVOKED = 10_000


class MemoryBackend(Generic[R]):
    def __init__(self, kind: Kind[R]) -> None:
        self._decode = kind.decode
        self._records: dict[str, bytes] = {}
        self._revoked: dict[str, float] = {}

    async def load_all(self) -> Snapshot[R]:
        records = [self._decode(raw) for raw in self._records.values()]
        return Snapshot(EPOCH, 0, records, dict(self._revoked))

    async def changes(self, seen: int) -> Changes[R]:
        return Changes(EPOCH, seen, [])  # every change is applied by the process that made it

    async def get(self, name: str) -> tuple[R, bytes] | None:
        raw = self._records.get(name)
        return None if raw is None else (self._decode(raw), raw)

    async def create(self, record: R, epoch: str) -> str:
        if record.name in self._records:
            raise WriteRefused("exists")
        self._records[record.name] = record.to_json()
        self._revoked.pop(record.name, None)
        return EPOCH

    async def update(self, record: R, expected: bytes, epoch: str) -> str:
        current = self._records.get(record.name)
        if current is None:
            raise WriteRefused("missing")
        if expected and current != expected:
            raise WriteRefused("changed")
        self._records[record.name] = record.to_json()
        return EPOCH

    async def delete(self, name: str, epoch: str, at: float) -> str:
        if self._records.pop(name, None) is None:
            revoked_at = self._revoked.get(name)
            if revoked_at is not None:
                raise WriteRefused("revoked", revoked_at)
            raise WriteRefused("missing")
        self._revoked[name] = at
        if len(self._revoked) > _KEEP_REVOKED:
            del self._revoked[next(iter(self._revoked))]
        return EPOCH

    async def merge(
        self, records: Sequence[R], revoked: Sequence[tuple[str, float]], epoch: str
    ) -> tuple[str, int]:
        return EPOCH, 0  # nothing to restore: this store is lost only with its process

    async def aclose(self) -> None:
        return None


class MemoryKeyBackend(MemoryBackend[KeyRecord]):
    """The client keys' (``records.KEYS``)."""

    def __init__(self) -> None:
        super().__init__(KEYS)
