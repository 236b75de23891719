"""The admin state as JSON-ready data (pure): what the limiter reports of every deployment
and client key, what the replicas report doing, and the configured limits beside them.

Times the limiter gives as "seconds from now" are shown both ways, ``{"in": seconds,
"at": ISO 8601 UTC}``, from the wall clock ``now`` of the moment the state was read.
Rates are shown as configured, and as in force in this process (``limit``: after this
worker's share when budgets are not shared, the pacing headroom, and what the upstream
announced); ``remaining`` and ``full_in`` are the limiter's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from proxy.limiter.base import (
    Activity,
    DeploymentState,
    KeyLimits,
    KeyState,
    LimiterMode,
    Quota,
    QuotaUsage,
    Window,
    scoped_name,
    window_name,
)

if TYPE_CHECKING:  # types only: this module stays free of I/O imports
    from proxy.catalog.catalog import Catalog, DeploymentRoute, GroupRoute
    from proxy.config.settings import ClientKey, LimitRule, Settings, Team

__all__ = ["Reading", "health_state", "moment", "state"]

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reading:
    """Everything read for one view, at wall-clock time ``now`` (seconds since the epoch)."""

    now: float
    mode: LimiterMode
    deployments: Mapping[str, Mapping[str, DeploymentState]]  # group -> id -> state
    keys: Mapping[str, KeyState]  # key name -> state
    activity: Sequence[Activity]  # one per live replica
    teams: Mapping[str, KeyState] = field(default_factory=dict)  # team name -> state


# The farthest moment shown: beyond it (a state written before holds were bounded, or
# any non-finite figure) a date would not exist, and the view must still answer.
LONGEST_SHOWN = 100 * 365 * 86400.0


def moment(seconds: float, now: float) -> Json:
    """``seconds`` from ``now``, relative and absolute (at most ``LONGEST_SHOWN``)."""
    if seconds != seconds:  # NaN
        seconds = 0.0
    seconds = min(max(seconds, -now), LONGEST_SHOWN)
    at = datetime.fromtimestamp(now + seconds, UTC).isoformat(timespec="milliseconds")
    return {"in": round(seconds, 3), "at": at.replace("+00:00", "Z")}


def health_state(s: DeploymentState) -> str:
    """``cooling`` (after failures, for ``cool_for``), ``probing`` (one request is out
    to prove it healthy), ``probe_next`` (cooldown over: the next request probes),
    ``held`` (an upstream 429 said when to send again) or ``healthy``."""
    if s.cooling:
        if s.cool_for > 0:
            return "cooling"
        return "probing" if s.probe_for > 0 else "probe_next"
    return "held" if s.hold_for > 0 else "healthy"


def state(
    settings: Settings,
    catalog: Catalog,
    reading: Reading,
    keys: Sequence[tuple[ClientKey, KeyLimits | None]] | None = None,
    keys_page: Json | None = None,
    api_teams: Sequence[tuple[Team, KeyLimits]] = (),
) -> Json:
    """The whole view: ``limiter``, ``models`` (their deployments), ``teams`` (the
    config's, then the admin API's: ``api_teams``, with their limits) and ``keys``: those
    given with their limits (a page: ``keys_page`` says which), or every config key."""
    now = reading.now
    totals = _sum(reading.activity)
    models = [_model(group, catalog, reading, totals) for group in catalog.groups.values()]
    if keys is None:
        keys = [(key, catalog.key_limits.get(key.name)) for key in settings.keys]
    shown = [
        _key(key, limits, reading.keys.get(key.name, KeyState()), totals, now)
        for key, limits in keys
    ]
    teams = [
        _owner(team, catalog.team_limits.get(team.name), reading.teams.get(team.name), now)
        for team in settings.teams
    ]
    teams += [_owner(team, limits, reading.teams.get(team.name), now) for team, limits in api_teams]
    anonymous = totals["waiting_keys"].get("", 0), totals["in_flight_keys"].get("", 0)
    shared = reading.mode is LimiterMode.SHARED
    return {
        "time": moment(0.0, now)["at"],
        "limiter": {
            "mode": reading.mode.value,
            # Shared: every replica's view (budgets, health, and each live replica's last
            # heartbeat, at most a second or so old). Otherwise: this process's own.
            "scope": "all replicas" if shared else "this process",
            "replicas_reporting": len(reading.activity),
            "pacing": catalog.pacing.view(),
        },
        "waiting": sum(totals["waiting"].values()),
        "models": models,
        "teams": teams,
        "keys": shown,
        **({"keys_page": keys_page} if keys_page is not None else {}),
        "without_key": {"waiting": anonymous[0], "in_flight": anonymous[1]},
    }


def _model(
    group: GroupRoute, catalog: Catalog, reading: Reading, totals: Mapping[str, Mapping[str, int]]
) -> Json:
    """A model group: its requests waiting (``waiting``), those of them that wait for a
    turn on one of its deployments (each deployment's ``waiting``) and the rest,
    ``waiting_for_any_deployment``: no turn taken yet (deferred for fair share, every
    deployment cooling, a probe's answer awaited). The two parts add up to ``waiting``."""
    states = reading.deployments.get(group.name, {})
    deployments = [
        _deployment(d, catalog, states.get(d.id), totals, reading.now) for d in group.deployments
    ]
    waiting = totals["waiting"].get(group.name, 0)
    on_turns = sum(d["waiting"] for d in deployments)
    return {
        "name": group.name,
        "waiting": waiting,
        # A deployment a reload removed may still hold turns of the group: counted here.
        "waiting_for_any_deployment": max(waiting - on_turns, 0),
        "deployments": deployments,
    }


def _deployment(
    d: DeploymentRoute,
    catalog: Catalog,
    s: DeploymentState | None,
    totals: Mapping[str, Mapping[str, int]],
    now: float,
) -> Json:
    s = s or DeploymentState(0.0, {})
    learned = None
    if s.learned > 0:
        learned = {
            "requests_per_second": round(s.learned, 6),
            "requests_per_minute": round(s.learned * 60, 3),
        }
    return {
        "id": d.id,
        "upstream_model": d.upstream_model,
        "health": {
            "state": health_state(s),
            "usable_in": moment(s.unusable_for, now),
            "cooldown_until": moment(s.cool_for, now) if s.cool_for > 0 else None,
            "probe_in_progress": s.probe_for > 0,
            "probe_until": moment(s.probe_for, now) if s.probe_for > 0 else None,
            "hold_until": moment(s.hold_for, now) if s.hold_for > 0 else None,
        },
        "windows": _windows(catalog.limits(d).windows, d.config.limit_rules(), s, now),
        "learned": learned,
        "next_turn": moment(s.next_turn, now),
        "in_flight": totals["in_flight"].get(d.id, 0),
        "waiting": totals["waiting_on"].get(d.id, 0),
    }


def _owner(
    owner: ClientKey | Team, limits: KeyLimits | None, s: KeyState | None, now: float
) -> Json:
    """A key's or a team's windows, budgets and parallel slots."""
    s = s or KeyState()
    windows = limits.windows if limits is not None else ()
    parallel = limits.max_parallel if limits is not None else None
    return {
        "name": owner.name,
        "windows": _windows(windows, owner.limit_rules(), s, now),
        "budgets": budgets(s.budgets, now),
        "max_parallel": parallel,
        "slots_held": s.slots_held if parallel is not None else None,
    }


def _key(
    key: ClientKey,
    limits: KeyLimits | None,
    s: KeyState,
    totals: Mapping[str, Mapping[str, int]],
    now: float,
) -> Json:
    name = key.name
    return {
        **_owner(key, limits, s, now),
        "team": key.team,
        "in_flight": totals["in_flight_keys"].get(name, 0),
        "waiting": totals["waiting_keys"].get(name, 0),
        "priority": key.priority,
        "weight": key.weight,
    }


def _windows(
    windows: Iterable[Window],
    rules: Iterable[LimitRule],
    s: DeploymentState | KeyState,
    now: float,
) -> list[Json]:
    configured = {scoped_name(window_name(r.kind, r.per), r.models): r for r in rules}
    return [_window(w, configured.get(w.name), s, now) for w in windows]


def _window(w: Window, rule: LimitRule | None, s: DeploymentState | KeyState, now: float) -> Json:
    """A window as configured (``rule``: None for one the config no longer has) and now;
    ``models``: the model groups it counts (None: every one)."""
    return {
        "name": w.name,
        "kind": w.kind,
        "models": list(rule.models) if rule is not None and rule.models else None,
        "per_seconds": w.rate.period,
        "configured": rule.amount if rule is not None else None,
        "limit": round(w.rate.limit, 3),
        # What "full" means: the most that can go at once (``limit`` for a key's window;
        # a deployment's burst, or a paced window's whole allowance).
        "capacity": round(w.rate.largest, 3),
        "remaining": round(s.remaining.get(w.name, w.rate.largest), 3),
        "full_in": moment(s.reset.get(w.name, 0.0), now),
    }


def budgets(left: Iterable[tuple[Quota, QuotaUsage]], now: float) -> list[Json]:
    """An owner's budgets like its windows: the period's quota, what is left, the reset."""
    return [
        {
            "name": q.name,
            "kind": q.kind,
            "period": q.period,
            "models": list(q.models) or None,
            "limit": q.limit,
            "spent": round(q.limit - u.remaining, 10),
            "remaining": round(u.remaining, 10),
            "resets": moment(u.resets_at - now, now),  # the period's end, exactly
        }
        for q, u in left
    ]


_FIELDS = ("waiting", "waiting_on", "waiting_keys", "in_flight", "in_flight_keys")


def _sum(activity: Iterable[Activity]) -> dict[str, dict[str, int]]:
    """Every replica's counts added up, per field."""
    totals: dict[str, dict[str, int]] = {f: {} for f in _FIELDS}
    for a in activity:
        for f in _FIELDS:
            counts = totals[f]
            for name, n in getattr(a, f).items():
                counts[name] = counts.get(name, 0) + n
    return totals
