"""Error responses in the contract's shape, for the non-forwarding routes."""

from __future__ import annotations

from starlette.responses import Response

from proxy.errors import ProxyError, render


def error_response(error: ProxyError) -> Response:
    status, body, headers = render(error)
    return Response(
        content=body, status_code=status, headers=headers, media_type="application/json"
    )
