"""Every exception a stage may raise, and the contract's error it is: one table.

As httpx's ``map_exceptions``: a list of rows, the first whose types the exception is an
instance of decides. ``contract_error`` is the one function that reads it
(``Pipeline.handle`` answers with what it returns); a row with no error (``to`` None) is
converted where it is raised and must never reach it (if one does, it is a bug: 500).
errors.py's docstring draws the table (``drawn``; tests/test_error_table.py keeps both
alike and finds every exception the request path raises in it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from proxy.costs import NoCount
from proxy.errors import ProxyError, ServiceUnavailable
from proxy.limiter.base import LimiterUnavailable, StorageError
from proxy.pipeline.affinity import AffinityUnavailable
from proxy.request.call import ClientGone
from proxy.routing.dispatcher import GateClosed, Retryable
from proxy.translate import Untranslatable
from proxy.upstream.encoding import Undecodable
from proxy.upstream.exchange import Untranslated
from proxy.upstream.forward import TransportFailure, UnusableAnswer
from proxy.upstream.interface import AnswerTooLarge

__all__ = ["ROWS", "Row", "contract_error", "drawn"]

logger = logging.getLogger("proxy.errors")


@dataclass(frozen=True, slots=True)
class Row:
    """``raised`` (by the module ``by``) is the contract's error ``to`` makes: its
    status, ``error.type``, ``error.code`` and ``retry-after`` (or what becomes of it), as
    drawn; ``to`` None: converted where it is raised, never answered as it is."""

    raised: tuple[type[BaseException], ...]
    by: str
    status: str
    type: str
    code: str
    retry_after: str
    to: Callable[[BaseException], ProxyError] | None = None


def _itself(exc: BaseException) -> ProxyError:
    assert isinstance(exc, ProxyError)
    return exc


def _limiter_down(exc: BaseException) -> ProxyError:
    return ServiceUnavailable(
        "The shared rate limiter is unavailable; retry shortly.",
        code="limiter_unavailable",
        retry_after=1.0,
    )


def _affinity_down(exc: BaseException) -> ProxyError:
    assert isinstance(exc, AffinityUnavailable)
    return ServiceUnavailable(
        "The store of where responses live (Redis) is unavailable and this replica"
        f" did not see '{exc.response_id}' created; retry shortly.",
        code="affinity_unavailable",
        param=exc.param,
        retry_after=1.0,
    )


def _wrapped(exc: BaseException) -> ProxyError:
    """A wrapper's own error (a refused key check, an upstream's failure), as mapped."""
    assert isinstance(exc, GateClosed | Retryable | TransportFailure | UnusableAnswer)
    return contract_error(exc.error)


_BUG = (Exception,)  # anything else
_AS_UNUSABLE = "as UnusableAnswer"

ROWS: tuple[Row, ...] = (
    Row((ProxyError,), "any", "its own", "its own", "its own", "its own", _itself),
    Row(
        (LimiterUnavailable,),
        "limiter",
        "503",
        "api_error",
        "limiter_unavailable",
        "1 s",
        _limiter_down,
    ),
    Row(
        (StorageError,), "limiter", "503", "api_error", "limiter_unavailable", "1 s", _limiter_down
    ),
    Row(
        (AffinityUnavailable,),
        "affinity",
        "503",
        "api_error",
        "affinity_unavailable",
        "1 s",
        _affinity_down,
    ),
    Row((GateClosed,), "dispatcher", "=", "=", "=", "its .error's", _wrapped),
    Row((Retryable,), "dispatcher", "=", "=", "=", "its .error's", _wrapped),
    Row(
        (TransportFailure,), "upstream", "502|504", "api_error", "see (a)", "its .error's", _wrapped
    ),
    Row(
        (UnusableAnswer,),
        "upstream",
        "502",
        "api_error",
        "upstream_error",
        "its .error's",
        _wrapped,
    ),
    Row((AnswerTooLarge,), "upstream", "502", "api_error", "upstream_error", _AS_UNUSABLE),
    Row((Undecodable,), "upstream", "502", "api_error", "upstream_error", _AS_UNUSABLE),
    Row((Untranslatable,), "translate", "502", "api_error", "upstream_error", _AS_UNUSABLE),
    Row((Untranslated,), "exchange", "-", "", "", "next deployment"),
    Row((NoCount,), "shapes", "-", "", "", "estimate charged"),
    Row((ClientGone,), "forwarding", "-", "", "", "no answer"),
    Row(_BUG, "any", "500", "api_error", "internal_error", "logged (a bug)"),
)


def contract_error(exc: BaseException, request_id: str | None = None) -> ProxyError:
    """The contract's error for ``exc`` (raised serving ``request_id``): its row's, else
    (not in the table, or one that must have been converted where raised) 500
    ``internal_error``, logged."""
    for row in ROWS:
        if isinstance(exc, row.raised) and row.to is not None:
            return row.to(exc)
    logger.error("unexpected error", exc_info=exc, extra={"request_id": request_id})
    return ProxyError("Internal proxy error.")


def drawn() -> list[str]:
    """The table as errors.py's docstring draws it, one line per row."""
    lines = [_line("raised", "by", "status", "type", "code", "retry-after, or")]
    for row in ROWS:
        names = ", ".join(t.__name__ for t in row.raised)
        lines.append(_line(names, row.by, row.status, row.type, row.code, row.retry_after))
    return lines


def _line(*cells: str) -> str:
    widths = (19, 10, 7, 9, 20)
    padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
    return (" ".join([*padded, cells[-1]])).rstrip()
