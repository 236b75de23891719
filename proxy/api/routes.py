"""The read-only endpoints: models, health and metrics (forwarding is in ``forwarding``)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response
from proxy.errors import ProxyError
from proxy.pipeline import Pipeline


def _pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


async def list_models(request: Request) -> Response:
    pipeline = _pipeline(request)
    try:
        key = pipeline.keys.authenticate(request.headers.get("authorization"))
    except ProxyError as error:
        return error_response(error)
    names = [g.name for g in pipeline.settings.models]
    if key is not None and key.models is not None:
        names = [n for n in names if n in key.models]
    body = {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "llm-proxy"} for n in names
        ],
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def live(request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


async def ready(request: Request) -> Response:
    state = request.app.state.readiness()
    status = 200 if state["ready"] else 503
    return Response(orjson.dumps(state), status_code=status, media_type="application/json")


async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
