"""``RuntimeTeams``: the teams of the admin API (``/admin/teams``), for one process.

The same store as the client keys' (``store.RecordStore``: this process's index, writes
to the backend first, a poll every 250 ms, a loss of the shared store's data detected by
its epoch and filled again), of ``team_records.TEAMS``: in Redis under
``llmproxy:{apiteams}:*``. The request path asks it for a team a key names that the
config does not have (``Catalog``), one dict access; a store never read answers 503
``key_store_unavailable`` rather than let the key pass without its team's limits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from proxy.config.settings import Team
from proxy.keys.backend import Kind
from proxy.keys.records import KeyRecord
from proxy.keys.store import RecordStore, backend_for, merged
from proxy.keys.team_records import TEAMS, TeamRecord
from proxy.limiter.redis.sentinel import SentinelTarget

__all__ = ["RuntimeTeams", "runtime_teams_for"]


class RuntimeTeams(RecordStore[TeamRecord]):
    """``on_gone`` tells the pipeline in force's catalog of a team gone
    (``Catalog.forget_team``)."""

    def _kind(self) -> Kind[TeamRecord]:
        return TEAMS

    # -- lookups (the request path) -------------------------------------------------------

    def team(self, name: str) -> Team | None:
        """The team named ``name`` (its record's, built once), None if there is none; a
        store never read raises its 503 (the team may be in it)."""
        record = self.index.get(name)
        if record is not None:
            return record.team()
        if not self.loaded:
            raise self.unavailable()
        return None

    async def cover(self, keys: Sequence[KeyRecord]) -> None:
        """Read the store again if ``keys`` (just read from the key store, not yet in
        use) name a team it lacks. A key's team is written before the key (a key naming a
        team that is not there is refused), so a read started after the key's has it: no
        replica serves a key without its team's limits, nor counts its windows apart from
        its team's (the key store's ``before_apply``). A team the config has, or one gone
        from it, costs one read more per batch of changed keys naming it."""
        if not self.shared:
            return
        named = {key.spec.get("team") for key in keys}
        if any(isinstance(name, str) and self.index.get(name) is None for name in named):
            await self.refresh()

    def needed(self, key_api: bool) -> bool:
        """Whether requests depend on reading the shared store: not read yet (with the
        admin API on, it may hold teams keys name), or it holds teams (their changes
        must reach this process)."""
        if not self.shared:
            return False
        if not self.loaded:
            return key_api
        return len(self.index) > 0

    # -- operations (the admin API) -------------------------------------------------------

    async def create(self, name: str, spec: dict[str, Any]) -> TeamRecord:
        now = self._clock()
        record = TeamRecord(name, spec, now, now)
        await self._create(record)
        return record

    async def update(
        self,
        name: str,
        changes: dict[str, Any],
        validate: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> TeamRecord:
        """``changes`` merged over the entry (a null removes a field), checked by
        ``validate``."""
        self._check_allowed()

        def change(record: TeamRecord) -> TeamRecord:
            return record.changed(merged(record.spec, changes, validate), self._clock())

        return await self._change(name, change, "update")

    async def delete(self, name: str) -> None:
        await self._delete(name, "delete")


def runtime_teams_for(
    redis_url: str, workers: int, timeout: float, sentinel: SentinelTarget | None = None
) -> RuntimeTeams:
    """The run-time team store of one process, where its keys' is (``backend_for``)."""
    backend, shared, refusal = backend_for(TEAMS, redis_url, workers, timeout, sentinel)
    return RuntimeTeams(backend, shared=shared, refusal=refusal)
