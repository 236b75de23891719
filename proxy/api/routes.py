"""The read-only endpoints: models, health and metrics (forwarding is in ``forwarding``)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.forwarding import presented_key
from proxy.api.responses import error_response
from proxy.errors import AuthenticationFailed, ModelNotFound, ProxyError
from proxy.pipeline.auth import bearer_matches
from proxy.pipeline.pipeline import Pipeline
from proxy.shapes import SHAPES
from proxy.shapes.credentials import ANTHROPIC_KEY, BEARER


def _pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


# The API shapes each API's clients call: Anthropic's SDKs (and Claude Code) send an
# ``anthropic-version`` header on every request, OpenAI's none.
_ANTHROPIC_SHAPES = frozenset(s.name for s in SHAPES if s.credential is ANTHROPIC_KEY)
_OPENAI_SHAPES = frozenset(s.name for s in SHAPES if s.credential is BEARER)


def _visible_groups(request: Request) -> list[str]:
    """The model groups the request's key may use (raises for a bad key) through the
    request's client's API (an Anthropic client's: the Messages API; any other's: one
    of OpenAI's), translation included (a group speaking chat completions is reached
    through the Messages API too, and the other way round): the key in either form a
    served API takes (``Authorization: Bearer``, ``x-api-key``)."""
    pipeline = _pipeline(request)
    header, presented = presented_key(BEARER.headers, request.headers.raw)
    key = pipeline.keys.authenticate(presented, BEARER, header)
    names = [g.name for g in pipeline.settings.models]
    if key is not None and key.models is not None:
        names = [n for n in names if n in key.models]
    anthropic = "anthropic-version" in request.headers
    apis = _ANTHROPIC_SHAPES if anthropic else _OPENAI_SHAPES
    groups = pipeline.catalog.groups
    return [n for n in names if n in groups and groups[n].shapes & apis]


def _visible_models(request: Request) -> list[str]:
    """The model names listed to the request's key: each group's name and aliases, in
    the config's order; a pattern is no model name, so a pattern group shows only its
    aliases (model_names.ModelNames.listed)."""
    return _pipeline(request).catalog.names.listed(_visible_groups(request))


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llm-proxy"}


async def list_models(request: Request) -> Response:
    try:
        names = _visible_models(request)
    except ProxyError as error:
        return error_response(error)
    body = {"object": "list", "data": [_model(n) for n in names]}
    return Response(orjson.dumps(body), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """One model as OpenAI describes it: any name a request may send (a group's, an
    alias, one a pattern serves); 404 for one the key may not use either."""
    name = request.path_params["model"]
    try:
        groups = _visible_groups(request)  # (a bad key: 401 first)
        if _pipeline(request).catalog.names.resolve(name) not in groups:
            raise ModelNotFound(f"The model '{name[:200]}' does not exist.", param="model")
    except ProxyError as error:
        return error_response(error)
    return Response(orjson.dumps(_model(name)), media_type="application/json")


async def live(request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


async def ready(request: Request) -> Response:
    state = request.app.state.readiness()
    status = 200 if state["ready"] else 503
    return Response(orjson.dumps(state), status_code=status, media_type="application/json")


async def metrics(request: Request) -> Response:
    token = request.app.state.settings.server.metrics_token.get_secret_value()
    if token and not bearer_matches(request.headers.get("authorization"), [token]):
        return error_response(
            AuthenticationFailed("GET /metrics needs the metrics token as a bearer token.")
        )
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
