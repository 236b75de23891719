"""``GET /admin/spend``: who spent what, per key, team and model, this period and the last.

``?period=month`` (default), ``week`` or ``day``; ``?format=csv`` for a spreadsheet;
``?by_day=true`` adds ``current.days``, the sums of each day of the current period so
far (JSON only). Reads of the ledger (money/ledger.py): the current period's totals,
the previous one's, and each day's when asked; this replica's spend of the last second
is not written yet. A row's ``estimated`` counts its requests reported at what their
budgets kept, no usage being known (spend.py). ``read_spend`` is also what the admin
page's spend view shows (admin_spend_view.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.api.responses import error_response
from proxy.errors import InvalidRequest, ServiceUnavailable
from proxy.limiter.base import Period, StorageError
from proxy.limiter.core import periods
from proxy.money import spend
from proxy.money.ledger import Ledger

__all__ = ["SpendUnavailable", "admin_spend", "read_spend", "read_views"]


class SpendUnavailable(ServiceUnavailable):
    def __init__(self) -> None:
        super().__init__(
            "The spend report's storage is unavailable; retry shortly.",
            code="limiter_unavailable",
            retry_after=1.0,
        )


async def read_spend(
    ledger: Ledger, period: Period, now: float, by_day: bool = False
) -> dict[str, Any]:
    """``GET /admin/spend``'s document for ``period`` at ``now`` (``by_day``: with the
    current period's days). Raises ``SpendUnavailable`` when the ledger cannot answer."""
    current = periods.index(period, now)
    days = spend.days_of(period, now) if by_day else range(0)
    try:
        this, last, *each_day = await asyncio.gather(
            ledger.totals(period, current),
            ledger.totals(period, current - 1),
            *(ledger.totals("day", day) for day in days),
        )
    except StorageError as error:
        raise SpendUnavailable() from error
    return spend.report(period, now, this, last, each_day if by_day else None)


async def read_views(ledger: Ledger, now: float) -> dict[Period, dict[str, Any]]:
    """What the spend view shows: today's, this week's and this month's documents, the
    month's with its days."""
    day, week, month = await asyncio.gather(
        read_spend(ledger, "day", now),
        read_spend(ledger, "week", now),
        read_spend(ledger, "month", now, by_day=True),
    )
    return {"day": day, "week": week, "month": month}


def _query(request: Request) -> tuple[Period, str, bool] | InvalidRequest:
    period = request.query_params.get("period", "month")
    if period not in periods.PERIODS:
        return InvalidRequest(
            f"'period' must be one of {', '.join(periods.PERIODS)}.", param="period"
        )
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        return InvalidRequest("'format' must be json or csv.", param="format")
    by_day = request.query_params.get("by_day", "false")
    if by_day not in ("true", "false"):
        return InvalidRequest("'by_day' must be true or false.", param="by_day")
    return period, fmt, by_day == "true" and fmt == "json"


async def admin_spend(request: Request) -> Response:
    asked = _query(request)
    if isinstance(asked, InvalidRequest):
        return error_response(asked)
    period, fmt, by_day = asked
    ledger: Ledger = request.app.state.ledger
    try:
        document = await read_spend(ledger, period, time.time(), by_day)
    except SpendUnavailable as error:
        return error_response(error)
    if fmt == "csv":
        return Response(
            spend.to_csv(document).encode(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="spend-{period}.csv"'},
        )
    return Response(orjson.dumps(document), media_type="application/json")
