"""What ``serve --workers N``'s parent tells the workers it spawns, by environment.

uvicorn spawns each worker as a fresh interpreter that builds the app from
``proxy.process.app:create_app_from_env``. The names live here, apart from the app, so that the
parent sets them without importing the app: the parent's start-up is on the way to the
first worker's, and importing the app (FastAPI, the pipeline) took it about 0.3 s.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CONFIG_ENV", "SUPERVISOR_ENV", "WORKERS_ENV"]

CONFIG_ENV: Final = "LLM_PROXY_CONFIG"  # the config file's absolute path
WORKERS_ENV: Final = "LLM_PROXY_WORKERS"  # how many workers share the budgets
SUPERVISOR_ENV: Final = "LLM_PROXY_SUPERVISOR_PID"  # the parent, which passes SIGHUP on
