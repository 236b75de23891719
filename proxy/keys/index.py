"""The run-time records this process knows, by name; client keys also by digest (*pure*).

Lookups are one dict access: the presented secret's sha256 to the key's name, a team's
name to its record. Changes arrive one record at a time (``apply``), so a change costs
the same with 10 records or 100,000; a page of the listing sorts the names once per
change, not once per call.
"""

from __future__ import annotations

import hmac
from typing import Generic

from proxy.config.settings import ClientKey
from proxy.errors import AuthenticationFailed
from proxy.keys.backend import R
from proxy.keys.records import KeyRecord
from proxy.limiter.base import KeyLimits

__all__ = ["KeyIndex", "RecordIndex"]


class RecordIndex(Generic[R]):
    def __init__(self) -> None:
        self._records: dict[str, R] = {}
        self._sorted: list[str] | None = None

    def __len__(self) -> int:
        return len(self._records)

    def get(self, name: str) -> R | None:
        return self._records.get(name)

    def apply(self, name: str, record: R | None) -> None:
        """``name`` is now ``record`` (None: it was deleted)."""
        old = self._records.pop(name, None)
        if old is not None:
            self._forget(name, old)
        if record is not None:
            self._records[name] = record
            self._learn(name, record)
        if (old is None) != (record is None):
            self._sorted = None

    def _forget(self, name: str, old: R) -> None:
        """What is indexed of ``old`` beside its name goes (a subclass's lookups)."""

    def _learn(self, name: str, record: R) -> None:
        """What is indexed of ``record`` beside its name comes."""

    def missing_from(self, newer: RecordIndex[R]) -> list[str]:
        """The names this index has and ``newer`` has not (no sort: a full reload asks
        it of 100,000 keys on the event loop)."""
        return [name for name in self._records if name not in newer._records]

    def records(self) -> list[R]:
        """Every record, in no order (a store that lost its data is given them back)."""
        return list(self._records.values())

    def names(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self._records)
        return self._sorted


class KeyIndex(RecordIndex[KeyRecord]):
    def __init__(self) -> None:
        super().__init__()
        self._by_digest: dict[str, str] = {}  # hex sha256 (current or previous) -> name

    def _forget(self, name: str, old: KeyRecord) -> None:
        for digest in old.digests():
            if self._by_digest.get(digest) == name:
                del self._by_digest[digest]

    def _learn(self, name: str, record: KeyRecord) -> None:
        for digest in record.digests():
            self._by_digest[digest] = name

    def find(self, sha256: str, now: float) -> tuple[ClientKey, KeyLimits] | None:
        """The key a secret of digest ``sha256`` opens at ``now``; None if no key has it.
        An expired key, or a rotated secret past its grace, raises a 401 saying so."""
        name = self._by_digest.get(sha256)
        if name is None:
            return None
        record = self._records[name]
        if not record.accepts(sha256, now):
            if record.expired(now):
                raise AuthenticationFailed("This API key has expired.", code="expired_api_key")
            raise AuthenticationFailed("Incorrect API key provided.")
        # The digest was found by hashing; the final check is in constant time anyway.
        if not hmac.compare_digest(sha256, record.sha256) and not hmac.compare_digest(
            sha256, record.previous_sha256 or ""
        ):
            return None
        return record.client_key()
