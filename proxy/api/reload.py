"""``POST /admin/reload``: re-read the config file in every worker (``reloading.py``).

200 with what changed; 400, OpenAI-shaped, with every problem of an invalid file (nothing
changed); 503 when the workers did not report back in time.
"""

from __future__ import annotations

from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response
from proxy.config.changes import ReloadResult
from proxy.errors import InvalidRequest, ServiceUnavailable

__all__ = ["Reloads", "reload_config"]


class Reloads(Protocol):
    """What ``app.state.reloader`` does for this endpoint (the process's reloader)."""

    async def reload_everywhere(self) -> ReloadResult: ...


async def reload_config(request: Request) -> Response:
    reloader: Reloads = request.app.state.reloader
    try:
        result = await reloader.reload_everywhere()
    except TimeoutError:
        return error_response(
            ServiceUnavailable(
                "The workers did not report a reload in time; see the proxy's log.",
                code="reload_timeout",
                retry_after=1.0,
            )
        )
    if not result.ok:
        return error_response(
            InvalidRequest(
                f"The config file is invalid; nothing changed. {len(result.problems)}"
                f" problem(s): {'; '.join(result.problems)}",
                code="invalid_config",
            )
        )
    return Response(orjson.dumps(result.as_dict()), media_type="application/json")
