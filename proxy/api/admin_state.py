"""``GET /admin/state``: what the limiter and the router know now, as JSON.

Reading it costs one limiter call per model group and per client key with limits (on a
single Redis, the calls of one loop turn go out in one pipelined round trip) and one for
the replicas' activity; nothing on any request's path. Storage trouble answers like any
limiter read through policy.py: this process's fallback view, or an empty one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.limiter.base import ManagedLimiter
from proxy.pipeline import Pipeline
from proxy.state_view import Reading, state

__all__ = ["admin_state", "read_state"]


async def read_state(pipeline: Pipeline, limiter: ManagedLimiter) -> dict[str, Any]:
    """The admin state of the config in force (the pipeline's)."""
    catalog = pipeline.catalog
    groups = list(catalog.groups.values())
    keys = list(catalog.key_limits.values())
    deployments, key_states, activity = await asyncio.gather(
        asyncio.gather(
            *(limiter.snapshot(g.name, [catalog.limits(d) for d in g.deployments]) for g in groups)
        ),
        asyncio.gather(*(limiter.key_snapshot(k) for k in keys)),
        limiter.activity(),
    )
    reading = Reading(
        now=time.time(),
        mode=limiter.mode,
        deployments={g.name: s for g, s in zip(groups, deployments, strict=True)},
        keys={k.name: s for k, s in zip(keys, key_states, strict=True)},
        activity=activity,
    )
    return state(pipeline.settings, catalog, reading)


async def admin_state(request: Request) -> Response:
    view = await read_state(request.app.state.pipeline, request.app.state.limiter)
    return Response(
        orjson.dumps(view, option=orjson.OPT_INDENT_2),
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )
