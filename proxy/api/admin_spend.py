"""``GET /admin/spend``: who spent what, per key, team and model, this period and the last.

``?period=month`` (default), ``week`` or ``day``; ``?format=csv`` for a spreadsheet.
Two reads of the ledger (limiter/ledger.py): the current period's totals and the
previous one's; this replica's spend of the last second is not written yet. A row's
``estimated`` counts its requests reported at what their budgets kept, no usage being
known (spend.py).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy import spend
from proxy.api.responses import error_response
from proxy.errors import InvalidRequest, ServiceUnavailable
from proxy.limiter.base import StorageError
from proxy.limiter.core import periods
from proxy.limiter.ledger import Ledger

__all__ = ["admin_spend"]


async def admin_spend(request: Request) -> Response:
    period = request.query_params.get("period", "month")
    if period not in periods.PERIODS:
        return error_response(
            InvalidRequest(f"'period' must be one of {', '.join(periods.PERIODS)}.", param="period")
        )
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        return error_response(InvalidRequest("'format' must be json or csv.", param="format"))
    ledger: Ledger = request.app.state.ledger
    now = time.time()
    current = periods.index(period, now)
    try:
        this, last = await asyncio.gather(
            ledger.totals(period, current), ledger.totals(period, current - 1)
        )
    except StorageError:
        return error_response(
            ServiceUnavailable(
                "The spend report's storage is unavailable; retry shortly.",
                code="limiter_unavailable",
                retry_after=1.0,
            )
        )
    document = spend.report(period, now, this, last)
    if fmt == "csv":
        return Response(
            spend.to_csv(document).encode(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="spend-{period}.csv"'},
        )
    return Response(orjson.dumps(document), media_type="application/json")
