"""One team created through the admin API, as stored (*pure*).

Its fields are those of a config team (``config.Team``: ``rpm``, ``tpm``, ``rpd``,
``tpd``, ``limits``, ``max_parallel``, ``budgets``), validated by that same model, so an
API team and a config team accept exactly the same limits and are enforced alike
(``Catalog``: the windows and budgets of every key naming it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from proxy.config.settings import Team
from proxy.errors import InvalidRequest
from proxy.keys.backend import Kind
from proxy.keys.records import check_models, entry_name, rfc3339, validated

__all__ = ["TEAMS", "TeamRecord", "validate_team"]


@dataclass(slots=True)
class TeamRecord:
    """``spec``: the config entry's fields without the name (validated); times are Unix
    seconds."""

    name: str
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    _built: Team | None = field(default=None, repr=False, compare=False)

    def team(self) -> Team:
        """The team as the catalog uses it, built on first use."""
        if self._built is None:
            self._built = Team.model_validate({**self.spec, "name": self.name})
        return self._built

    def changed(self, spec: dict[str, Any], now: float) -> TeamRecord:
        return replace(self, spec=spec, updated_at=now, _built=None)

    def public(self) -> dict[str, Any]:
        """The entry as the API lists it."""
        return {
            "name": self.name,
            **self.spec,
            "source": "api",
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "name": self.name,
                "spec": self.spec,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> TeamRecord:
        data = orjson.loads(raw)
        return cls(data["name"], data["spec"], data["created_at"], data["updated_at"])


TEAMS: Kind[TeamRecord] = Kind(
    noun="team",
    label="run-time teams",
    tag="apiteams",
    decode=TeamRecord.from_json,
    path="/admin/teams",
    gone="deleted",
    retry_says={
        "create": "a retry answers 409 team_exists if it was",
        "update": "retrying the same change is safe",
        "delete": "a retry answers 204, or 404 team_deleted if it was",
    },
    exists_note=" (if an earlier create of it answered that its outcome is unknown, it happened)",
)


def validate_team(
    body: object, *, name: str | None, models: frozenset[str]
) -> tuple[str, dict[str, Any]]:
    """A team entry sent to the API: its name and its fields, validated as a config
    team's. ``name``: the one in the path (a PATCH), which the body may not change;
    ``models``: the configured groups a window's or a budget's ``models`` may name.
    Raises ``InvalidRequest`` naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object: a team entry.")
    fields = dict(body)
    name = entry_name(fields, name, "team")
    check_models(validated(Team, {**fields, "name": name}, "team"), models)
    return name, fields
