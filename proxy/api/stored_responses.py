"""A stored response's routes (OpenAI's Responses API), as plain ASGI apps:

    GET /v1/responses/{id}      DELETE /v1/responses/{id}
    POST /v1/responses/{id}/cancel      GET /v1/responses/{id}/input_items

No body, no model: the key is checked as on the forwarding endpoints, then the pipeline
sends the request to the deployment that holds the response (``follow_ups.py``), with
its method, path and query as the client sent them. ``GET /v1/responses/{id}?stream=true``
(a background response's events, ``responses.retrieve(id, stream=True)``) is answered as
a streamed create is: its events passed through as they come.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from urllib.parse import parse_qsl

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.api.forwarding import _disconnected, presented_key, send_reply, whole_for
from proxy.errors import ProxyError
from proxy.pipeline.follow_ups import StoredRoute
from proxy.pipeline.pipeline import Pipeline
from proxy.request.call import Reply
from proxy.shapes.responses import STORED_RESPONSES

__all__ = ["routes"]

# OpenAI's ids are ``resp_`` and hex; anything else in a path is never passed upstream.
_ID = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


class StoredResponseEndpoint:
    """One route below ``/v1/responses/{response_id}`` (``tail``: ``""``, ``/cancel``,
    ``/input_items``)."""

    def __init__(self, pipeline: Callable[[], Pipeline], tail: str) -> None:
        self._pipeline = pipeline
        self.tail = tail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pipeline = self._pipeline()
        pipeline.enter()
        try:
            reply = await self._answer(pipeline, scope, receive)
            whole = whole_for(scope, STORED_RESPONSES, self._pipeline)
            await send_reply(reply, receive, send, whole)
        finally:
            pipeline.leave()

    async def _answer(self, pipeline: Pipeline, scope: Scope, receive: Receive) -> Reply:
        shape = STORED_RESPONSES
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            header, presented = presented_key(shape.credential.headers, raw_headers)
            key = pipeline.keys.authenticate(presented, shape.credential, header)
        except ProxyError as error:
            return pipeline.reject(shape, error)
        response_id = scope["path_params"]["response_id"]
        if not _ID.match(response_id):
            response_id = ""  # no such id: the pipeline answers 404
        query = scope.get("query_string", b"").decode("latin-1")
        path = f"/{response_id}{self.tail}" + (f"?{query}" if query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
        method = scope["method"]
        stream = method == "GET" and not self.tail and _streamed(query)
        return await pipeline.handle(
            shape,
            b"",
            headers,
            key,
            client_left=partial(_disconnected, receive),
            route=StoredRoute(method, response_id, path, stream),
        )


def _streamed(query: str) -> bool:
    """Whether the query asks for the response's events (``stream=true``, as the OpenAI
    SDK sends it; the last ``stream`` counts)."""
    values = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "stream"]
    return bool(values) and values[-1].lower() == "true"


def routes(pipeline: Callable[[], Pipeline]) -> list[Route]:
    """The routes, for the app's router (``pipeline``: the one in force)."""
    below = "/v1/responses/{response_id}"
    return [
        Route(below, StoredResponseEndpoint(pipeline, ""), methods=["GET", "DELETE"]),
        Route(f"{below}/cancel", StoredResponseEndpoint(pipeline, "/cancel"), methods=["POST"]),
        Route(
            f"{below}/input_items",
            StoredResponseEndpoint(pipeline, "/input_items"),
            methods=["GET"],
        ),
    ]
