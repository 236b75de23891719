"""The run-time keys this process knows, by digest and by name (*pure*).

Lookups are one dict access: the presented secret's sha256 to the key's name. Changes
arrive one record at a time (``apply``), so a change costs the same with 10 keys or
100,000; a page of the listing sorts the names once per change, not once per call.
"""

from __future__ import annotations

import hmac

from proxy.config import ClientKey
from proxy.errors import AuthenticationFailed
from proxy.keys.records import KeyRecord
from proxy.limiter.base import KeyLimits

__all__ = ["KeyIndex"]


class KeyIndex:
    def __init__(self) -> None:
        self._records: dict[str, KeyRecord] = {}
        self._by_digest: dict[str, str] = {}  # hex sha256 (current or previous) -> name
        self._sorted: list[str] | None = None

    def __len__(self) -> int:
        return len(self._records)

    def get(self, name: str) -> KeyRecord | None:
        return self._records.get(name)

    def apply(self, name: str, record: KeyRecord | None) -> None:
        """``name`` is now ``record`` (None: it was revoked)."""
        old = self._records.pop(name, None)
        if old is not None:
            for digest in old.digests():
                if self._by_digest.get(digest) == name:
                    del self._by_digest[digest]
        if record is not None:
            self._records[name] = record
            for digest in record.digests():
                self._by_digest[digest] = name
        if (old is None) != (record is None):
            self._sorted = None

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

    def missing_from(self, newer: KeyIndex) -> list[str]:
        """The names this index has and ``newer`` has not (no sort: a full reload asks
        it of 100,000 keys on the event loop)."""
        return [name for name in self._records if name not in newer._records]

    def records(self) -> list[KeyRecord]:
        """Every record, in no order (a store that lost its data is given them back)."""
        return list(self._records.values())

    def names(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self._records)
        return self._sorted
