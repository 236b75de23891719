"""What ``/admin/keys`` and ``/admin/teams`` share: JSON in and out, who called (the
admin key's position), the audit of each write (``keys/audit.py``: every operation one
log line and one metric, refused calls included, naming what was asked for), and a config
entry as the listings show it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response
from proxy.config.settings import Settings
from proxy.errors import InvalidRequest, ProxyError
from proxy.keys.audit import audit
from proxy.keys.store import Conflict
from proxy.pipeline.auth import bearer_matches

__all__ = [
    "Asked",
    "audited",
    "configured_entry",
    "json_response",
    "model_groups",
    "read_body",
    "refuse_configured",
    "who",
]

Handler = Callable[[Request], Awaitable[Response]]


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def who(request: Request) -> str:
    """Which admin key called: its position in ``admin.keys`` (a name, never the key)."""
    settings: Settings = request.app.state.settings
    authorization = request.headers.get("authorization")
    for position, secret in enumerate(settings.admin.secrets()):
        if bearer_matches(authorization, [secret]):
            return f"admin.keys[{position}]"
    return "admin"


async def read_body(request: Request) -> Any:
    """The JSON body, None if empty."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The body is not valid JSON.") from None


def model_groups(settings: Settings) -> frozenset[str]:
    """The configured model groups (what an entry's ``models`` may name)."""
    return frozenset(m.name for m in settings.models)


def refuse_configured(noun: str, name: str, configured: object) -> None:
    """409 ``config_<noun>`` when ``configured`` (the config's entry named ``name``, or
    None) is there: what the config file holds changes only there."""
    if configured is not None:
        raise Conflict(
            f"The {noun} '{name}' comes from the config file: change it there (and reload).",
            code=f"config_{noun}",
        )


class Asked:
    """The name of what a call is about, as soon as it is known (the path's, or a
    create's body's): every audit line names it, refused calls' too."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def named_by(self, body: object) -> None:
        """A create's: the body's name, even if the entry is refused."""
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            self.name = body["name"]


Operation = Callable[[Request, Settings, Asked], Awaitable[Response]]


def audited(operation: str, run: Operation, *, subject: str = "key") -> Handler:
    """``run`` as a handler whose every call, refused or not, is audited as
    ``operation`` on a ``subject`` (``key``, ``team``)."""

    async def handler(request: Request) -> Response:
        settings: Settings = request.app.state.settings
        asked = Asked(request.path_params.get("name", ""))
        metrics = request.app.state.metrics
        try:
            response = await run(request, settings, asked)
        except ProxyError as error:
            audit(metrics, operation, asked.name, who(request), error, subject=subject)
            return error_response(error)
        audit(metrics, operation, asked.name, who(request), subject=subject)
        return response

    return handler


def configured_entry(owner: BaseModel, fields: Collection[str], name: str) -> dict[str, Any]:
    """A config key's or team's entry as the API lists it: ``fields`` it sets, then its
    ``limits`` and ``budgets`` as lists, ``"source": "config"``."""
    entry: dict[str, Any] = {"name": name, "source": "config"}
    for field in fields:
        value = getattr(owner, field)
        if value is not None:
            entry[field] = value
    limits = getattr(owner, "limits", None)
    if limits:
        entry["limits"] = [rule.model_dump() for rule in limits]
    budgets = getattr(owner, "budgets", None)
    if budgets:
        entry["budgets"] = [b.model_dump(exclude_none=True) for b in budgets]
    return entry
