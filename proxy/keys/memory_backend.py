"""Run-time keys in this process only (no ``redis.url``): lost on restart, and with
``--workers N`` refused (``store.py``), since each worker would hold its own."""

from __future__ import annotations

from proxy.keys.records import KeyRecord
from proxy.keys.redis_backend import WriteRefused

__all__ = ["MemoryKeyBackend"]


class MemoryKeyBackend:
    def __init__(self) -> None:
        self._records: dict[str, bytes] = {}

    async def load_all(self) -> tuple[int, list[KeyRecord]]:
        return 0, [KeyRecord.from_json(raw) for raw in self._records.values()]

    async def changes(self, seen: int) -> tuple[int, list[tuple[str, KeyRecord | None]] | None]:
        return seen, []  # every change is applied by the process that made it

    async def get(self, name: str) -> tuple[KeyRecord, bytes] | None:
        raw = self._records.get(name)
        return None if raw is None else (KeyRecord.from_json(raw), raw)

    async def create(self, record: KeyRecord) -> None:
        if record.name in self._records:
            raise WriteRefused("exists")
        self._records[record.name] = record.to_json()

    async def update(self, record: KeyRecord, expected: bytes) -> None:
        current = self._records.get(record.name)
        if current is None:
            raise WriteRefused("missing")
        if expected and current != expected:
            raise WriteRefused("changed")
        self._records[record.name] = record.to_json()

    async def delete(self, name: str) -> None:
        if self._records.pop(name, None) is None:
            raise WriteRefused("missing")

    async def aclose(self) -> None:
        return None
