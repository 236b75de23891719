"""Turning pipeline replies into ASGI responses."""

from __future__ import annotations

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError, render
from proxy.pipeline import Reply, StreamBody


class StreamBodyResponse(StreamingResponse):
    """A stream whose upstream is closed and budgets settled however the send ends
    (finished, client gone before the first byte, or cancelled mid-stream)."""

    def __init__(self, body: StreamBody, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(
            body, status_code=status_code, headers=headers, media_type="text/event-stream"
        )
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except OSError:
            pass  # the client went away; the finally below cleans up
        finally:
            await self._body.aclose()


def to_response(reply: Reply) -> Response:
    if reply.stream is not None:
        return StreamBodyResponse(reply.stream, reply.status, reply.headers)
    return Response(content=reply.body, status_code=reply.status, headers=reply.headers)


def error_response(error: ProxyError, background: BackgroundTask | None = None) -> Response:
    status, body, headers = render(error)
    return Response(
        content=body,
        status_code=status,
        headers=headers,
        media_type="application/json",
        background=background,
    )
