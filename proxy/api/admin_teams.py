"""``/admin/teams``: teams created, listed, changed and deleted at run time, as keys are
(``admin_keys.py``; the contract: "Teams by API, as keys").

A team's entry is a config team's (``rpm``, ``tpm``, ``rpd``, ``tpd``, ``limits``,
``max_parallel``, ``budgets``), validated by the same model. Teams of the config file are
listed with ``"source": "config"`` and cannot be changed here (409 ``config_team``); they
win on a name clash. A team that API keys still name cannot be deleted (409
``team_in_use``, naming them): its keys would silently lose its limits; revoke them or
move them to another team first. Every write is audited (``team_create``,
``team_update``, ``team_delete``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.api.admin_records import (
    Asked,
    audited,
    configured_entry,
    json_response,
    model_groups,
    read_body,
    refuse_configured,
)
from proxy.api.responses import error_response
from proxy.config.settings import Settings, Team
from proxy.errors import ModelNotFound, ProxyError
from proxy.keys.listing import parse_page
from proxy.keys.store import Conflict, RuntimeKeys
from proxy.keys.team_records import validate_team
from proxy.keys.teams import RuntimeTeams

__all__ = ["ROUTES", "configured_team"]

# What a config team's entry shows besides its name, ``limits`` and ``budgets``.
_CONFIG_FIELDS = tuple(f for f in Team.model_fields if f not in ("name", "limits", "budgets"))
_USERS_SHOWN = 20  # keys named in a refused delete's message


def _teams(request: Request) -> RuntimeTeams:
    teams: RuntimeTeams = request.app.state.runtime_teams
    return teams


def _refuse_config_team(settings: Settings, name: str) -> None:
    refuse_configured("team", name, settings.team(name))


async def _create(request: Request, settings: Settings, asked: Asked) -> Response:
    body = await read_body(request)
    asked.named_by(body)
    name, spec = validate_team(body, name=None, models=model_groups(settings))
    _refuse_config_team(settings, name)
    record = await _teams(request).create(name, spec)
    return json_response(record.public(), status=201)


async def _update(request: Request, settings: Settings, asked: Asked) -> Response:
    name = asked.name
    _refuse_config_team(settings, name)
    body = await read_body(request)
    models = model_groups(settings)
    # The fields sent, alone (a null removes one: checked once merged).
    sent = {k: v for k, v in body.items() if v is not None} if isinstance(body, dict) else body
    validate_team(sent, name=name, models=models)
    assert isinstance(body, dict)
    changes = {k: v for k, v in body.items() if k != "name"}

    def validate(spec: dict[str, Any]) -> dict[str, Any]:
        return validate_team({**spec, "name": name}, name=name, models=models)[1]

    record = await _teams(request).update(name, changes, validate)
    return json_response(record.public())


async def _delete(request: Request, settings: Settings, asked: Asked) -> Response:
    name = asked.name
    _refuse_config_team(settings, name)
    teams = _teams(request)
    await teams.read_now()  # a team another replica created lately included
    if await teams.get(name) is not None:
        keys: RuntimeKeys = request.app.state.runtime_keys
        await keys.read_now()  # and the keys other replicas gave it lately
        users = keys.in_team(name)
        if users:
            shown = ", ".join(users[:_USERS_SHOWN])
            more = f" and {len(users) - _USERS_SHOWN} more" if len(users) > _USERS_SHOWN else ""
            raise Conflict(
                f"The team '{name}' has {len(users)} API key(s): {shown}{more}. Move them to"
                ' another team (PATCH /admin/keys/{name} with "team") or revoke them first.',
                code="team_in_use",
            )
    await teams.delete(name)
    return Response(status_code=204)


def configured_team(team: Team) -> dict[str, Any]:
    """A config team's entry as the API lists it (``"source": "config"``)."""
    return configured_entry(team, _CONFIG_FIELDS, team.name)


async def list_teams(request: Request) -> Response:
    """``GET /admin/teams?page=N&per_page=M&name_prefix=P``: the config's teams first
    (in file order), then the API's, by name."""
    settings: Settings = request.app.state.settings
    query = request.query_params
    try:
        page, per_page = parse_page(query)
    except ProxyError as error:
        return error_response(error)
    prefix = query.get("name_prefix", "")
    every = {t.name: t for t in settings.teams}
    configured = [name for name in every if name.startswith(prefix)]
    teams = _teams(request)
    chosen, records = teams.listing(configured, page, per_page, prefix, hidden=every)
    entries = [configured_team(every[name]) for name in chosen.configured]
    entries += [record.public() for record in records]
    return json_response(
        {"teams": entries, "page": page, "pages": chosen.pages, "total": chosen.total}
    )


async def get_team(request: Request) -> Response:
    """``GET /admin/teams/{name}``: one entry, the config's or the API's."""
    settings: Settings = request.app.state.settings
    name = request.path_params["name"]
    configured = settings.team(name)
    if configured is not None:
        return json_response(configured_team(configured))
    teams = _teams(request)
    try:
        await teams.ensure_read()
    except ProxyError as error:
        return error_response(error)
    record = await teams.get(name)
    if record is None:
        return error_response(
            ModelNotFound(f"No team is named '{name[:200]}'.", code="team_not_found")
        )
    return json_response(record.public())


# (path, handler, methods), registered behind the admin keys by admin.py.
ROUTES: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
    ("/admin/teams", list_teams, ["GET"]),
    ("/admin/teams", audited("team_create", _create, subject="team"), ["POST"]),
    ("/admin/teams/{name}", get_team, ["GET"]),
    ("/admin/teams/{name}", audited("team_update", _update, subject="team"), ["PATCH"]),
    ("/admin/teams/{name}", audited("team_delete", _delete, subject="team"), ["DELETE"]),
]
