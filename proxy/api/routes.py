"""OpenAI-compatible endpoints, operations endpoints, and contract-shaped fallbacks."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response, to_response
from proxy.errors import BodyTooLarge, ProxyError, UnsupportedMediaType
from proxy.pipeline import Pipeline

_JSON_TYPES = ("application/json", "+json")


def _pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def _check_content_type(request: Request) -> None:
    content_type = request.headers.get("content-type")
    if content_type is None:
        return  # lenient: a JSON body without a declared type is still parsed
    media = content_type.split(";", 1)[0].strip().lower()
    if not (media == "application/json" or media.endswith("+json")):
        raise UnsupportedMediaType(f"Content-Type must be application/json, not '{media[:100]}'.")


async def _proxy(request: Request, endpoint: str) -> Response:
    pipeline = _pipeline(request)
    try:
        _check_content_type(request)
        raw = await _read_body(request, pipeline.settings.server.max_body_size)
    except ProxyError as error:
        return to_response(pipeline.reject(endpoint, error))
    reply = await pipeline.handle(
        endpoint, raw, request.headers.items(), request.headers.get("authorization")
    )
    return to_response(reply)


async def chat_completions(request: Request) -> Response:
    return await _proxy(request, "chat/completions")


async def completions(request: Request) -> Response:
    return await _proxy(request, "completions")


async def embeddings(request: Request) -> Response:
    return await _proxy(request, "embeddings")


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
