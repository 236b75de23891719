"""Error responses in the contract's shape, for the non-forwarding routes (and requests
refused before a forwarding endpoint has them), in the error shape of the API whose path
they came to (``shapes.surface``)."""

from __future__ import annotations

from starlette.responses import Response

from proxy.errors import ProxyError
from proxy.shapes import surface


def error_response(error: ProxyError, path: str = "") -> Response:
    """``error`` as an answer to a request to ``path`` (none: OpenAI's shape, the
    contract's)."""
    return Response(
        content=surface(path).error_body(error),
        status_code=error.status,
        headers=error.headers(),
        media_type="application/json",
    )
