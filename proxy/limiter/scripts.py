"""The Lua scripts, read from package files (``proxy/limiter/lua/*.lua``).

Each operation is one script. The bucket scripts are prefixed with ``bucket.lua``, the
shared math; the deployment scripts also with the health constants (taken from
``proxy.routing.health`` and ``verdicts``, so Lua and Python cannot disagree on them) and
``health.lua``. Every script is thus self-contained for EVALSHA. No redis import here:
tests run the same sources through any client.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from proxy.limiter.verdicts import IN_FLIGHT_MARGIN
from proxy.routing import health

LIBRARY = "bucket"
HEALTH_LIBRARY = "health"
KEY_SCRIPTS = ("acquire_key", "release_key")
DEPLOYMENT_SCRIPTS = (
    "reserve_deployment",
    "correct_deployment",
    "settle_deployment",
    "sync_budget",
    "deployment_health",
    "deployment_budget",
)
BUCKET_SCRIPTS = KEY_SCRIPTS + DEPLOYMENT_SCRIPTS
PLAIN_SCRIPTS = ("heartbeat",)

CONSTANTS = {
    "DECREASE": health.DECREASE,
    "MIN_FACTOR": health.MIN_FACTOR,
    "RECOVERY_PER_SECOND": health.RECOVERY_PER_SECOND,
    "FORGET_AFTER": health.FORGET_AFTER,
    "FORGET_SLACK": health.FORGET_SLACK,
    "IN_FLIGHT_MARGIN": IN_FLIGHT_MARGIN,
}


@cache
def source(name: str) -> str:
    """The full text of the script ``name`` (without ``.lua``)."""
    if name not in BUCKET_SCRIPTS + PLAIN_SCRIPTS:
        raise ValueError(f"no such limiter script: {name!r}")
    body = _read(name)
    if name in DEPLOYMENT_SCRIPTS:
        return f"{_read(LIBRARY)}\n{_constants()}\n{_read(HEALTH_LIBRARY)}\n{body}"
    return f"{_read(LIBRARY)}\n{body}" if name in BUCKET_SCRIPTS else body


def _constants() -> str:
    # repr is the shortest text that reads back as the same double (Lua uses strtod).
    return "\n".join(f"local {name} = {float(value)!r}" for name, value in CONSTANTS.items())


def _read(name: str) -> str:
    return resources.files("proxy.limiter").joinpath("lua", f"{name}.lua").read_text("utf-8")
