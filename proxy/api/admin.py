"""The operator's endpoints under ``/admin``: who may call them, and their routes.

They exist only while ``admin.keys`` names at least one key (otherwise 404, as for any
unknown path), and need one of those keys as a bearer token (otherwise 401). The HTML pages
and the spend report (``/admin/spend``, which the page's spend view links to) also take it
as the password of HTTP Basic credentials, and their 401 asks for them: a plain browser
shows its login prompt, then sends them with every refresh of the page. The config is
read per request, so a reload that adds, rotates or removes admin keys takes effect at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.api import admin_keys, admin_teams
from proxy.api.admin_keys_page import key_manager
from proxy.api.admin_page import admin_page
from proxy.api.admin_spend import admin_spend
from proxy.api.admin_state import admin_state
from proxy.api.reload import reload_config
from proxy.api.responses import error_response
from proxy.config.settings import Settings
from proxy.errors import AuthenticationFailed, ModelNotFound
from proxy.pipeline.auth import bearer_matches

__all__ = ["ROUTES", "admin_only"]

Handler = Callable[[Request], Awaitable[Response]]


def admin_only(handler: Handler, *, browser: bool = False) -> Handler:
    """``handler`` behind the admin keys of the config in force; ``browser``: a page,
    which also takes them as a Basic password and asks a browser for one."""

    async def guarded(request: Request) -> Response:
        settings: Settings = request.app.state.settings
        secrets = settings.admin.secrets()
        if not secrets:
            return error_response(
                ModelNotFound(f"Unknown path {request.url.path[:200]}.", code="unknown_url")
            )
        if not bearer_matches(request.headers.get("authorization"), secrets, basic=browser):
            refused = error_response(
                AuthenticationFailed(
                    "The admin endpoints need an admin key: 'Authorization: Bearer ADMIN_KEY'"
                    + (
                        " (or, in a browser, as the password of its login prompt)."
                        if browser
                        else "."
                    ),
                    code="invalid_admin_key",
                )
            )
            if browser:
                refused.headers["www-authenticate"] = (
                    'Basic realm="llm-proxy admin", charset="UTF-8"'
                )
            return refused
        return await handler(request)

    return guarded


# (path, handler, methods): each admin endpoint, registered by create_app. The page is
# the one a browser opens.
ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/admin", admin_page, ["GET"]),
    ("/admin/state", admin_state, ["GET"]),
    ("/admin/spend", admin_spend, ["GET"]),
    ("/admin/reload", reload_config, ["POST"]),
    ("/admin/key-manager", key_manager, ["GET"]),
    *admin_keys.ROUTES,
    *admin_teams.ROUTES,
]


# What a browser opens (HTTP Basic accepted, and asked for): the pages, and the spend
# report the spend view links to (its CSV), which only reads (a cross-site page can
# send a browser there but not read the answer: no CORS). The rest of the JSON API takes
# bearer tokens only, so no credential a browser sends by itself can drive it (CSRF).
_PAGES = frozenset({"/admin", "/admin/key-manager", "/admin/spend"})


def routes() -> list[Route]:
    return [
        Route(path, admin_only(handler, browser=path in _PAGES), methods=methods)
        for path, handler, methods in ROUTES
    ]
