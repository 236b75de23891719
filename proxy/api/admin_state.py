"""``GET /admin/state``: what the limiter and the router know now, as JSON.

Reading it costs one limiter call per model group, per team and per client key with
limits on the page asked for (``?page=N&per_page=M``: 100 keys a page by default, the
config's first, then the admin API's; on a single Redis, the calls of one loop turn go out in one
pipelined round trip) and one for the replicas' activity; nothing on any request's
path. Storage trouble answers like any limiter read through policy.py: this process's
fallback view, or an empty one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.admin_state_view import Reading, state
from proxy.api.responses import error_response
from proxy.config.settings import ClientKey, Team
from proxy.errors import ProxyError
from proxy.keys.listing import DEFAULT_PER_PAGE, page_of, parse_page
from proxy.keys.store import RuntimeKeys
from proxy.keys.teams import RuntimeTeams
from proxy.limiter.base import KeyLimits, ManagedLimiter
from proxy.pipeline.pipeline import Pipeline

__all__ = ["admin_state", "read_state", "requested_state"]


async def read_state(
    pipeline: Pipeline,
    limiter: ManagedLimiter,
    runtime: RuntimeKeys | None = None,
    page: int = 1,
    per_page: int = DEFAULT_PER_PAGE,
    team_store: RuntimeTeams | None = None,
) -> dict[str, Any]:
    """The admin state of the config in force (the pipeline's), with one page of the
    client keys: the config's, then the admin API's (``runtime``); the admin
    API's store of teams (its status): ``team_store``."""
    catalog = pipeline.catalog
    settings = pipeline.settings
    groups = list(catalog.groups.values())
    configured = settings.keys.by_name()  # names to positions: only the page is built
    if runtime is not None:
        chosen, records = runtime.page(configured, page, per_page)
    else:
        chosen, records = page_of(settings.keys.names(), [], page, per_page), []
    shown: list[tuple[ClientKey, KeyLimits | None]] = [
        (settings.keys[configured[name]], catalog.key_limits.get(name))
        for name in chosen.configured
    ]
    # An API key in a team: its windows live with its team's (the Redis hash tag).
    built = (record.client_key() for record in records)
    shown += [(key, catalog.with_team(key, limits)) for key, limits in built]
    keys = [limits for _, limits in shown if limits is not None]
    api_teams = _api_teams(pipeline, team_store)
    teams = [*catalog.team_limits.values(), *_limits_of(api_teams)]
    deployments, key_states, team_states, activity = await asyncio.gather(
        asyncio.gather(
            *(limiter.snapshot(g.name, [catalog.limits(d) for d in g.deployments]) for g in groups)
        ),
        asyncio.gather(*(limiter.key_snapshot(k) for k in keys)),
        asyncio.gather(*(limiter.key_snapshot(t) for t in teams)),
        limiter.activity(),
    )
    reading = Reading(
        now=time.time(),
        mode=limiter.mode,
        deployments={g.name: s for g, s in zip(groups, deployments, strict=True)},
        keys={k.name: s for k, s in zip(keys, key_states, strict=True)},
        activity=activity,
        teams={t.name: s for t, s in zip(teams, team_states, strict=True)},
    )
    view = state(settings, catalog, reading, shown, chosen.as_dict(), api_teams)
    view.update(_stores(key_store=runtime, team_store=team_store))
    return view


def _api_teams(pipeline: Pipeline, team_store: RuntimeTeams | None) -> list[tuple[Team, KeyLimits]]:
    """The admin API's teams this process knows (not a config team's name), with their
    limits as requests are charged to them."""
    if team_store is None:
        return []
    configured = {team.name for team in pipeline.settings.teams}
    found = []
    for record in team_store.index.records():
        limits = pipeline.catalog.team_limits_now(record.name)
        if record.name not in configured and limits is not None:
            found.append((record.team(), limits))
    return found


def _limits_of(teams: list[tuple[Team, KeyLimits]]) -> list[KeyLimits]:
    return [limits for _, limits in teams]


def _stores(**stores: RuntimeKeys | RuntimeTeams | None) -> dict[str, Any]:
    """The admin API's stores (keys, teams), by name: read? lost their data?"""
    return {name: store.status() for name, store in stores.items() if store is not None}


async def requested_state(request: Request) -> dict[str, Any]:
    """The state with the page of client keys the query asks for (``?page=N&per_page=M``,
    default 1 and 100; a bad one raises its 400): ``/admin/state``'s and ``/admin``'s."""
    page, per_page = parse_page(request.query_params)
    app = request.app.state
    return await read_state(
        app.pipeline, app.limiter, app.runtime_keys, page, per_page, app.runtime_teams
    )


async def admin_state(request: Request) -> Response:
    try:
        view = await requested_state(request)
    except ProxyError as error:
        return error_response(error)
    return Response(
        orjson.dumps(view, option=orjson.OPT_INDENT_2),
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )
