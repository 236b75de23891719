"""``/admin/keys``: client keys created, listed, changed, rotated and revoked at run time
(the contract's table, docs/design "Client keys managed at run time").

The secret is returned once, by create and rotate, and stored only as its sha256. Keys
of the config file are listed with ``"source": "config"`` and cannot be changed here
(409); they win on a name clash. Every operation is audited (``keys/audit.py``).
"""

from __future__ import annotations

import time
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
from proxy.config.settings import ClientKey, Settings
from proxy.errors import ProxyError
from proxy.keys.listing import parse_page
from proxy.keys.records import KeyRecord, parse_expiry, parse_grace, validate_entry
from proxy.keys.store import RuntimeKeys
from proxy.keys.teams import RuntimeTeams

__all__ = ["ROUTES"]

# What a config key's entry shows: every field of a config key (as an API key's shows
# every field it was given) but its name, its secret, and ``limits`` (listed as rules).
_CONFIG_FIELDS = tuple(
    field
    for field in ClientKey.model_fields
    if field not in ("name", "key", "key_sha256", "limits", "budgets")
)


def _keys(request: Request) -> RuntimeKeys:
    keys: RuntimeKeys = request.app.state.runtime_keys
    return keys


async def _known_teams(request: Request, settings: Settings, body: object) -> frozenset[str]:
    """The teams a key may name: the config's and the admin API's (its store read first
    if the key names a team the config does not have: else a 503)."""
    configured = frozenset(t.name for t in settings.teams)
    teams: RuntimeTeams = request.app.state.runtime_teams
    team = body.get("team") if isinstance(body, dict) else None
    if isinstance(team, str) and team not in configured:
        await teams.ensure_read()
    return configured | frozenset(teams.names())


def _refuse_config_key(settings: Settings, name: str) -> None:
    refuse_configured("key", name, settings.keys.get(name))


async def _create(request: Request, settings: Settings, asked: Asked) -> Response:
    body = await read_body(request)
    asked.named_by(body)
    teams = await _known_teams(request, settings, body)
    name, spec, expires_at, _ = validate_entry(
        body, name=None, models=model_groups(settings), teams=teams
    )
    _refuse_config_key(settings, name)
    record, secret = await _keys(request).create(name, spec, expires_at)
    return json_response({"name": record.name, "key": secret, **_public(record)}, status=201)


async def _update(request: Request, settings: Settings, asked: Asked) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    body = await read_body(request)
    models, teams = model_groups(settings), await _known_teams(request, settings, body)
    validate_entry(body, name=name, models=models, teams=teams)  # the fields sent, alone
    assert isinstance(body, dict)
    changes = {k: v for k, v in body.items() if k not in ("name", "expires_at")}
    expires = (parse_expiry(body["expires_at"]),) if "expires_at" in body else None

    def validate(spec: dict[str, Any]) -> dict[str, Any]:
        return validate_entry({**spec, "name": name}, name=name, models=models, teams=teams)[1]

    record = await _keys(request).update(name, changes, expires, validate)
    return json_response(_public(record))


async def _rotate(request: Request, settings: Settings, asked: Asked) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    grace = parse_grace(await read_body(request))
    record, secret = await _keys(request).rotate(name, grace)
    return json_response({"name": record.name, "key": secret, **_public(record)})


async def _revoke(request: Request, settings: Settings, asked: Asked) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    await _keys(request).revoke(name)
    return Response(status_code=204)


def _public(record: KeyRecord) -> dict[str, Any]:
    return record.public(time.time())


async def list_keys(request: Request) -> Response:
    """``GET /admin/keys?page=N&per_page=M&team=T&name_prefix=P``: the config's keys
    first, then the API's, by name (those of team ``T``); no secrets."""
    keys = _keys(request)
    settings: Settings = request.app.state.settings
    query = request.query_params
    try:
        page, per_page = parse_page(query)
    except ProxyError as error:
        return error_response(error)
    prefix = query.get("name_prefix", "")
    team = query.get("team")
    configured = settings.keys
    every = configured.by_name()  # names to positions: no key is built to page them
    if prefix:
        every = {n: i for n, i in every.items() if n.startswith(prefix)}
    by_name = every
    if team is not None:
        by_name = {n: i for n, i in every.items() if configured.team_of(i) == team}
    chosen, records = keys.page(by_name, page, per_page, prefix, team=team, hidden=every)
    now = time.time()
    entries = [_configured(configured[by_name[name]]) for name in chosen.configured]
    entries += [record.public(now) for record in records]
    return json_response(
        {"keys": entries, "page": page, "pages": chosen.pages, "total": chosen.total}
    )


def _configured(key: ClientKey) -> dict[str, Any]:
    return configured_entry(key, _CONFIG_FIELDS, key.name)


# (path, handler, methods), registered behind the admin keys by admin.py.
ROUTES: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
    ("/admin/keys", list_keys, ["GET"]),
    ("/admin/keys", audited("create", _create), ["POST"]),
    ("/admin/keys/{name}", audited("update", _update), ["PATCH"]),
    ("/admin/keys/{name}/rotate", audited("rotate", _rotate), ["POST"]),
    ("/admin/keys/{name}", audited("revoke", _revoke), ["DELETE"]),
]
