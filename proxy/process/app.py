"""Wiring: ``create_app(settings)`` builds the ASGI app; the lifespan owns every resource.

Nothing is built at import time. The HTTP client and the limiter are created inside the
running event loop at start-up and closed at shutdown, after pending budget
bookkeeping has been flushed.
"""

from __future__ import annotations

import gc
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import shapes
from proxy.api import admin, routes, stored_responses
from proxy.api.forwarding import ForwardingEndpoint, HotPathRouter
from proxy.api.responses import error_response
from proxy.config import fast_paths
from proxy.config.settings import Settings, config_warnings, load_settings
from proxy.errors import InvalidRequest, ModelNotFound, ProxyError
from proxy.keys.store import RuntimeKeys, runtime_keys_for
from proxy.keys.teams import RuntimeTeams, runtime_teams_for
from proxy.limiter.base import LimiterMode, ManagedLimiter
from proxy.limiter.factory import create_limiter, sentinel_target
from proxy.money.ledger import create_ledger
from proxy.observability.logs import configure_logging
from proxy.observability.metrics import Metrics
from proxy.observability.observer import StateObserver, publish_configured_state
from proxy.observability.telemetry import close_tracing
from proxy.pipeline.auth import open_when_empty
from proxy.pipeline.pipeline import Pipeline
from proxy.process.config_watch import ConfigWatcher, FileSignature, file_signature
from proxy.process.reloading import Reloader, hold_sighup
from proxy.process.startup import tracing_for
from proxy.process.worker_env import CONFIG_ENV, SUPERVISOR_ENV, WORKERS_ENV
from proxy.upstream.client import create_transport

__all__ = ["create_app", "create_app_from_env"]

logger = logging.getLogger("proxy")


def create_app(
    settings: Settings,
    *,
    workers: int = 1,
    tune_gc: bool = False,
    config_path: str | None = None,
    config_seen: FileSignature = None,
    supervisor: int | None = None,
) -> HotPathRouter:
    """The proxy as an ASGI app. ``workers`` is how many processes serve this config:
    with the in-memory limiter each holds ``1/workers`` of every budget. ``tune_gc``
    (for a process of its own, as the CLI runs it) tunes the garbage collector once
    started (``tune_garbage_collector``). ``config_path``: the file ``settings`` came
    from, re-read by a reload (SIGHUP, when this is the main thread, or
    ``POST /admin/reload``, or when it changes: ``config_seen`` is how it was just before
    it was read, ``config_watch.py``; None: as it is now); ``supervisor``: the pid of the
    process that passes SIGHUP on to every worker (``supervisor.py``)."""
    if config_path is not None and config_seen is None:
        config_seen = file_signature(config_path)
    shared = settings.redis.shared
    share = 1.0 if shared else 1.0 / max(workers, 1)
    metrics = Metrics(budget_shared=shared)
    _warn_about(settings, workers, shared)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # This process's tracer provider, its own (each worker has one): None when
        # telemetry.traces is off (OpenTelemetry is then not imported).
        tracing = tracing_for(settings.telemetry)
        sentinel = settings.redis.sentinel
        target = sentinel_target(sentinel) if sentinel is not None else None
        replica_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        limiter = create_limiter(
            settings.redis.url or None,
            on_error=settings.redis.on_error,
            replica_id=replica_id,
            timeout=settings.redis.timeout,
            sentinel=target,
        )
        limiter.on_mode_change(
            lambda mode: metrics.set_fallback_active(mode is LimiterMode.FALLBACK)
        )
        limiter.on_storage_error(metrics.limiter_error)
        limiter.on_eviction_policy(metrics.set_redis_evicting_policy)
        await limiter.start()
        transport = create_transport(lean=fast_paths.enabled("lean"))
        transport.prepare(
            (d.base_url, bool(d.proxy_url.get_secret_value()))
            for group in settings.models
            for d in group.deployments
        )
        runtime_keys = runtime_keys_for(
            settings.redis.url, workers, settings.redis.timeout, sentinel=target
        )
        runtime_keys.on_lost = metrics.key_store_lost
        runtime_teams = runtime_teams_for(
            settings.redis.url, workers, settings.redis.timeout, sentinel=target
        )
        runtime_teams.on_lost = metrics.key_store_lost
        runtime_keys.before_apply = runtime_teams.cover  # a key's team before the key
        await runtime_teams.start()  # first: a key read may name a team
        await runtime_keys.start()
        app.state.runtime_keys = runtime_keys
        app.state.runtime_teams = runtime_teams
        ledger = create_ledger(limiter)
        await ledger.start()
        pipeline = Pipeline(
            settings,
            limiter,
            transport,
            metrics,
            share=share,
            runtime_keys=runtime_keys,
            runtime_teams=runtime_teams,
            ledger=ledger,
            tracing=tracing,
        )
        app.state.pipeline = pipeline
        app.state.ledger = ledger
        app.state.limiter = limiter
        # What this replica is doing, with every heartbeat: the pipeline in force's.
        limiter.publish(lambda: app.state.pipeline.activity())
        # The pacing margin this replica's turns need, shared with every heartbeat, and
        # the other live replicas' heard back (catalog/pacing.py): one object for the
        # process, carried over by reloads.
        pacing = pipeline.catalog.pacing
        pacing.identify(replica_id)
        limiter.share_pacing(pacing.own, pacing.heard)
        publish_configured_state(settings, metrics, share)
        observer = StateObserver(pipeline.catalog, limiter, metrics)
        observer.start()
        app.state.observer = observer
        reloader = Reloader(
            app.state,
            config_path,
            limiter=limiter,
            transport=transport,
            metrics=metrics,
            observer=observer,
            share=share,
            workers=workers,
            supervisor=supervisor,
            tracing=tracing,
        )
        app.state.reloader = reloader
        watcher: ConfigWatcher | None = None
        if config_path is not None:
            reloader.install_signal()
            if settings.server.watch_config > 0:
                interval = settings.server.watch_config
                watcher = ConfigWatcher(config_path, config_seen, interval, reloader.reload)
                watcher.start()
        if tune_gc:
            tune_garbage_collector()
        try:
            yield
        finally:
            if watcher is not None:
                await watcher.aclose()
            await reloader.aclose()
            await observer.aclose()
            await app.state.pipeline.drain()
            await ledger.aclose()  # what is pending written before the limiter closes
            await transport.aclose()
            await runtime_keys.aclose()
            await runtime_teams.aclose()
            await limiter.aclose()
            await close_tracing(tracing)  # the spans of the last requests exported

    app = FastAPI(
        title="llm-proxy",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.readiness = lambda: _readiness(app)
    forwarding = {
        path: ForwardingEndpoint(shape, lambda: app.state.pipeline)
        for path, shape in shapes.BY_PATH.items()
    }
    # A shape served at path templates: one endpoint, found by ``shapes.match``.
    patterned = {
        shape.name: ForwardingEndpoint(shape, lambda: app.state.pipeline)
        for _, shape in shapes.PATTERNS
    }
    templates = [(p, e) for e in patterned.values() for p in e.shape.paths]
    # Plain Starlette routes: the hot path reads raw bytes, no per-request model parsing.
    app.router.routes.extend(
        [
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in forwarding.items()),
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in templates),
            *stored_responses.routes(lambda: app.state.pipeline),
            Route("/v1/models", routes.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", routes.retrieve_model, methods=["GET"]),
            Route("/health/live", routes.live, methods=["GET"]),
            Route("/health/ready", routes.ready, methods=["GET"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
            *admin.routes(),
        ]
    )
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_exception)
    app.add_exception_handler(Exception, _unexpected_exception)
    # The forwarding endpoints are also routed past the middleware stack: they need none
    # of it, and it was a tenth of the per-request cost.
    return HotPathRouter(app, forwarding, patterned)


def create_app_from_env() -> HotPathRouter:
    """Factory for ``uvicorn --factory`` (used by ``--workers N``): config from the env."""
    hold_sighup()  # the supervisor may pass one on before the app has started
    path = os.environ[CONFIG_ENV]
    seen = file_signature(path)  # before reading: a change from here on is reloaded
    settings = load_settings(path)
    configure_logging(settings.server.log_level)
    supervisor = os.environ.get(SUPERVISOR_ENV)
    return create_app(
        settings,
        workers=int(os.environ.get(WORKERS_ENV, "1")),
        tune_gc=True,
        config_path=path,
        config_seen=seen,
        supervisor=int(supervisor) if supervisor else None,
    )


# A request allocates thousands of short-lived objects, nearly all freed by reference
# counting; with CPython's default thresholds (a collection every 700 net allocations)
# the collector keeps re-scanning the long-lived ones (modules, config, connections).
# Measured on 2 cores at 64 connections: about a third less CPU per request.
GC_THRESHOLDS = (20_000, 50, 100)


def tune_garbage_collector() -> None:
    """Collect once, freeze what start-up built, and collect young objects less often."""
    gc.collect()
    gc.freeze()  # start-up objects leave the collector's view for good
    gc.set_threshold(*GC_THRESHOLDS)


def _readiness(app: FastAPI) -> dict[str, Any]:
    pipeline: Pipeline | None = getattr(app.state, "pipeline", None)
    if pipeline is None:
        return {"ready": False, "reason": "starting"}
    limiter: ManagedLimiter = app.state.limiter
    observer: StateObserver = app.state.observer
    usable = observer.usable()
    runtime: RuntimeKeys = app.state.runtime_keys
    teams: RuntimeTeams = app.state.runtime_teams
    settings = pipeline.settings
    # A replica that cannot read the admin API's key store, when requests depend on it,
    # is not ready (design.md): it cannot tell a revoked or a new key; nor its teams'
    # (a team's changed limits).
    key_api = bool(settings.admin.secrets())
    needed = runtime.needed(key_api, bool(settings.keys))
    stores = (runtime.current or not needed) and (teams.current or not teams.needed(key_api))
    return {
        "ready": limiter.ready and usable > 0 and stores,
        "limiter": limiter.mode.value,
        "deployments_usable": usable,
        "key_store": runtime.state() if runtime.shared else "process",
    }


def _warn_about(settings: Settings, workers: int, shared: bool) -> None:
    for warning in config_warnings(settings):
        logger.warning("config: %s", warning)
    if not settings.keys and open_when_empty(settings):
        logger.warning(
            "No client keys configured: the proxy accepts requests from anyone (dev only)."
        )
    elif not settings.keys:
        logger.info(
            "No client keys in the config file: every client key lives in the admin API's"
            " store (/admin/keys); while it holds none, requests get 401"
            " (server.open_access: false)."
        )
    if not shared:
        note = (
            f" with {workers} workers each holds 1/{workers} of every budget" if workers > 1 else ""
        )
        logger.info("In-memory rate limiter (no redis.url)%s.", note)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        error: ProxyError = ModelNotFound(
            f"Unknown path {request.url.path[:200]}.", code="unknown_url"
        )
    elif exc.status_code == 405:
        error = InvalidRequest(
            f"Method {request.method} is not allowed on {request.url.path[:200]}.",
            code="method_not_allowed",
        )
        error.status = 405
    else:
        error = InvalidRequest(str(exc.detail))
        error.status = exc.status_code
    return error_response(error, request.url.path)


async def _validation_exception(request: Request, exc: Exception) -> Response:
    return error_response(InvalidRequest("Invalid request."), request.url.path)


async def _unexpected_exception(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s", request.url.path)
    return error_response(ProxyError("Internal proxy error."), request.url.path)
