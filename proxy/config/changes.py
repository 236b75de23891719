"""What a reload changes: the difference between the config in force and a new one.

Names only (keys, models, deployments; never a secret), for the reload's log line and
``POST /admin/reload``'s answer, and the settings a running process cannot take without a
restart (``RESTART_ONLY``): the reload applies everything else and says these need one.
*Pure*: no I/O.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.config.settings import Settings

__all__ = ["RESTART_ONLY", "ConfigChanges", "ReloadResult", "config_changes", "in_force"]

_T = TypeVar("_T")

# Read once by what the process built at start: the limiter's connection and policy
# (redis.*), uvicorn's protocol (header_timeout, body_timeout), the logging set-up
# (log_level), the config file's watcher (watch_config) and the tracer provider
# (telemetry.traces: proxy/observability/tracing.py).
RESTART_ONLY = (
    "redis.url",
    "redis.sentinel",
    "redis.on_error",
    "redis.timeout",
    "server.header_timeout",
    "server.body_timeout",
    "server.log_level",
    "server.watch_config",
    "telemetry.traces",
)


@dataclass(frozen=True, slots=True)
class Changed:
    """Names added, removed and changed among one kind of entry."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": list(self.changed),
        }


@dataclass(frozen=True, slots=True)
class ConfigChanges:
    keys: Changed
    models: Changed
    deployments: Changed  # "model/deployment"
    other: tuple[str, ...]  # top-level sections that changed: routing, admin, server...
    restart_needed: tuple[str, ...]  # of RESTART_ONLY, what differs (kept as it was)
    teams: Changed = Changed()

    @property
    def any(self) -> bool:
        return bool(self.keys or self.teams or self.models or self.deployments or self.other)

    def as_dict(self) -> dict[str, Any]:
        return {
            "keys": self.keys.as_dict(),
            "teams": self.teams.as_dict(),
            "models": self.models.as_dict(),
            "deployments": self.deployments.as_dict(),
            "other": list(self.other),
            "restart_needed": list(self.restart_needed),
        }


def config_changes(old: Settings, new: Settings) -> ConfigChanges:
    deployments_old = {f"{m.name}/{d.id}": d for m in old.models for d in m.deployments}
    deployments_new = {f"{m.name}/{d.id}": d for m in new.models for d in m.deployments}
    restart = tuple(path for path in RESTART_ONLY if _at(old, path) != _at(new, path))
    other = tuple(
        section
        for section in ("routing", "admin", "server", "telemetry")
        if getattr(old, section) != getattr(new, section)
        and not _only_restart_fields(section, old, new, restart)
    )
    return ConfigChanges(
        # By name and position: the keys' entries are compared, none is built.
        keys=_changed(
            old.keys.by_name(),
            new.keys.by_name(),
            lambda was, now: new.keys.same_as(now, old.keys, was),
        ),
        # A group "changes" when its own fields do; its deployments are listed apart.
        models=_changed(
            {m.name: m.model_copy(update={"deployments": []}) for m in old.models},
            {m.name: m.model_copy(update={"deployments": []}) for m in new.models},
        ),
        deployments=_changed(deployments_old, deployments_new),
        other=other,
        restart_needed=restart,
        teams=_changed({t.name: t for t in old.teams}, {t.name: t for t in new.teams}),
    )


def in_force(old: Settings, new: Settings) -> Settings:
    """``new`` as a running process applies it: the ``RESTART_ONLY`` fields stay ``old``'s."""
    server = _kept("server", old, new)
    telemetry = _kept("telemetry", old, new)
    return new.model_copy(update={"redis": old.redis, "server": server, "telemetry": telemetry})


def _kept(section: str, old: Settings, new: Settings) -> Any:
    """``new``'s ``section`` with the ``RESTART_ONLY`` fields of ``old``'s."""
    kept = {
        field: getattr(getattr(old, section), field) for field in _fields_of(section, RESTART_ONLY)
    }
    return getattr(new, section).model_copy(update=kept)


def _changed(
    old: Mapping[str, _T],
    new: Mapping[str, _T],
    same: Callable[[_T, _T], bool] = operator.eq,
) -> Changed:
    return Changed(
        added=tuple(n for n in new if n not in old),
        removed=tuple(n for n in old if n not in new),
        changed=tuple(n for n in new if n in old and not same(old[n], new[n])),
    )


def _at(settings: Settings, path: str) -> object:
    section, field = path.split(".")
    return getattr(getattr(settings, section), field)


def _only_restart_fields(
    section: str, old: Settings, new: Settings, restart: tuple[str, ...]
) -> bool:
    """Whether ``section`` differs only in fields a reload does not apply."""
    keep = _fields_of(section, restart)
    if not keep:
        return False
    left = getattr(old, section).model_dump(exclude=keep)
    right = getattr(new, section).model_dump(exclude=keep)
    return bool(left == right)


def _fields_of(section: str, paths: tuple[str, ...]) -> set[str]:
    """The fields of ``section`` among ``paths`` (``"server.log_level"``: ``log_level``)."""
    return {path.split(".")[1] for path in paths if path.startswith(f"{section}.")}


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """A reload's outcome in one process: what changed, or every problem of the file."""

    ok: bool
    problems: tuple[str, ...] = ()
    changes: ConfigChanges | None = None

    def as_dict(self) -> dict[str, Any]:
        if not self.ok:
            return {"reloaded": False, "problems": list(self.problems)}
        assert self.changes is not None
        return {"reloaded": True, "pid": os.getpid(), **self.changes.as_dict()}
