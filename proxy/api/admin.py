"""The operator's endpoints under ``/admin``: who may call them, and their routes.

They exist only while ``admin.keys`` names at least one key (otherwise 404, as for any
unknown path), and need one of those keys as a bearer token (otherwise 401). The config is
read per request, so a reload that adds, rotates or removes admin keys takes effect at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.api.admin_page import admin_page
from proxy.api.admin_state import admin_state
from proxy.api.reload import reload_config
from proxy.api.responses import error_response
from proxy.auth import bearer_matches
from proxy.config import Settings
from proxy.errors import AuthenticationFailed, ModelNotFound

__all__ = ["ROUTES", "admin_only"]

Handler = Callable[[Request], Awaitable[Response]]


def admin_only(handler: Handler) -> Handler:
    """``handler`` behind the admin keys of the config in force."""

    async def guarded(request: Request) -> Response:
        settings: Settings = request.app.state.settings
        secrets = settings.admin.secrets()
        if not secrets:
            return error_response(
                ModelNotFound(f"Unknown path {request.url.path[:200]}.", code="unknown_url")
            )
        if not bearer_matches(request.headers.get("authorization"), secrets):
            return error_response(
                AuthenticationFailed(
                    "The admin endpoints need an admin key: 'Authorization: Bearer ADMIN_KEY'.",
                    code="invalid_admin_key",
                )
            )
        return await handler(request)

    return guarded


# (path, handler, methods): each admin endpoint, registered by create_app.
ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/admin", admin_page, ["GET"]),
    ("/admin/state", admin_state, ["GET"]),
    ("/admin/reload", reload_config, ["POST"]),
]


def routes() -> list[Route]:
    return [Route(path, admin_only(handler), methods=methods) for path, handler, methods in ROUTES]
