"""The audit trail of client key operations: one log line and one metric each.

The log line names the key and who did it (the admin key's position in ``admin.keys``,
never the key itself); the metric's labels are the operation and its result only, fixed
sets, so an API caller's names never become label values. No secret is ever passed here.
"""

from __future__ import annotations

import logging

from proxy.errors import ProxyError
from proxy.metrics import Metrics

__all__ = ["audit", "result_of"]

logger = logging.getLogger("proxy.keys.audit")

_RESULTS = {400: "invalid", 404: "not_found", 409: "conflict", 503: "unavailable"}


def result_of(error: ProxyError | None) -> str:
    """``success``, or what went wrong; ``unknown``: a write sent to the shared store
    whose answer never came (it may have happened)."""
    if error is None:
        return "success"
    return getattr(error, "audit_result", None) or _RESULTS.get(error.status, "invalid")


def audit(
    metrics: Metrics, operation: str, name: str, who: str, error: ProxyError | None = None
) -> None:
    result = result_of(error)
    metrics.key_operation(operation, result)
    fields = {"operation": operation, "key_name": name[:200], "who": who, "result": result}
    if error is not None:
        fields["reason"] = error.code
    logger.log(logging.INFO if error is None else logging.WARNING, "key operation", extra=fields)
