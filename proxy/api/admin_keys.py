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

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response
from proxy.auth import bearer_matches
from proxy.config import ClientKey, Settings
from proxy.errors import InvalidRequest, ProxyError
from proxy.keys.audit import audit
from proxy.keys.listing import parse_page
from proxy.keys.records import KeyRecord, parse_expiry, parse_grace, validate_entry
from proxy.keys.store import Conflict, RuntimeKeys

__all__ = ["ROUTES"]

# What a config key's entry shows: every field of a config key (as an API key's shows
# every field it was given) but its name, its secret, and ``limits`` (listed as rules).
_CONFIG_FIELDS = tuple(
    field
    for field in ClientKey.model_fields
    if field not in ("name", "key", "key_sha256", "limits", "budgets")
)


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _who(request: Request) -> str:
    """Which admin key called: its position in ``admin.keys`` (a name, never the key)."""
    settings: Settings = request.app.state.settings
    authorization = request.headers.get("authorization")
    for position, secret in enumerate(settings.admin.secrets()):
        if bearer_matches(authorization, [secret]):
            return f"admin.keys[{position}]"
    return "admin"


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The body is not valid JSON.") from None


def _config_key(settings: Settings, name: str) -> ClientKey | None:
    return settings.keys.get(name)


def _models(settings: Settings) -> frozenset[str]:
    return frozenset(m.name for m in settings.models)


def _teams(settings: Settings) -> frozenset[str]:
    return frozenset(t.name for t in settings.teams)


class _Asked:
    """The name of the key a call is about, as soon as it is known (the path's, or a
    create's body's): every audit line names it, refused calls' too."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


Operation = Callable[[Request, RuntimeKeys, Settings, _Asked], Awaitable[Response]]


def _audited(operation: str, run: Operation) -> Callable[[Request], Awaitable[Response]]:
    async def handler(request: Request) -> Response:
        keys: RuntimeKeys = request.app.state.runtime_keys
        settings: Settings = request.app.state.settings
        asked = _Asked(request.path_params.get("name", ""))
        try:
            response = await run(request, keys, settings, asked)
        except ProxyError as error:
            audit(request.app.state.metrics, operation, asked.name, _who(request), error)
            return error_response(error)
        audit(request.app.state.metrics, operation, asked.name, _who(request))
        return response

    return handler


def _refuse_config_key(settings: Settings, name: str) -> None:
    if _config_key(settings, name) is not None:
        raise Conflict(
            f"The key '{name}' comes from the config file: change it there (and reload).",
            code="config_key",
        )


async def _create(
    request: Request, keys: RuntimeKeys, settings: Settings, asked: _Asked
) -> Response:
    body = await _body(request)
    if isinstance(body, dict) and isinstance(body.get("name"), str):
        asked.name = body["name"]  # named in the audit even if the entry is refused
    name, spec, expires_at, _ = validate_entry(
        body, name=None, models=_models(settings), teams=_teams(settings)
    )
    _refuse_config_key(settings, name)
    record, secret = await keys.create(name, spec, expires_at)
    return _json({"name": record.name, "key": secret, **_public(record)}, status=201)


async def _update(
    request: Request, keys: RuntimeKeys, settings: Settings, asked: _Asked
) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    body = await _body(request)
    models, teams = _models(settings), _teams(settings)
    validate_entry(body, name=name, models=models, teams=teams)  # the fields sent, alone
    assert isinstance(body, dict)
    changes = {k: v for k, v in body.items() if k not in ("name", "expires_at")}
    expires = (parse_expiry(body["expires_at"]),) if "expires_at" in body else None

    def validate(spec: dict[str, Any]) -> dict[str, Any]:
        return validate_entry({**spec, "name": name}, name=name, models=models, teams=teams)[1]

    record = await keys.update(name, changes, expires, validate)
    return _json(_public(record))


async def _rotate(
    request: Request, keys: RuntimeKeys, settings: Settings, asked: _Asked
) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    grace = parse_grace(await _body(request))
    record, secret = await keys.rotate(name, grace)
    return _json({"name": record.name, "key": secret, **_public(record)})


async def _revoke(
    request: Request, keys: RuntimeKeys, settings: Settings, asked: _Asked
) -> Response:
    name = asked.name
    _refuse_config_key(settings, name)
    await keys.revoke(name)
    return Response(status_code=204)


def _public(record: KeyRecord) -> dict[str, Any]:
    return record.public(time.time())


async def list_keys(request: Request) -> Response:
    """``GET /admin/keys?page=N&per_page=M&team=T&name_prefix=P``: the config's keys
    first, then the API's, by name (those of team ``T``); no secrets."""
    keys: RuntimeKeys = request.app.state.runtime_keys
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
    return _json({"keys": entries, "page": page, "pages": chosen.pages, "total": chosen.total})


def _configured(key: ClientKey) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": key.name, "source": "config"}
    for field in _CONFIG_FIELDS:
        value = getattr(key, field)
        if value is not None:
            entry[field] = value
    if key.limits:
        entry["limits"] = [rule.model_dump() for rule in key.limits]
    if key.budgets:
        entry["budgets"] = [b.model_dump(exclude_none=True) for b in key.budgets]
    return entry


# (path, handler, methods), registered behind the admin keys by admin.py.
ROUTES: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
    ("/admin/keys", list_keys, ["GET"]),
    ("/admin/keys", _audited("create", _create), ["POST"]),
    ("/admin/keys/{name}", _audited("update", _update), ["PATCH"]),
    ("/admin/keys/{name}/rotate", _audited("rotate", _rotate), ["POST"]),
    ("/admin/keys/{name}", _audited("revoke", _revoke), ["DELETE"]),
]
