"""The audit trail of operations on client keys and teams: one log line and one metric
each.

The log line (``key operation``, ``team operation``) names the key or team and who did it
(the admin key's position in ``admin.keys``, never the key itself); the metric's labels
are the operation (``create`` ... ``revoke``, ``team_create`` ... ``team_delete``) and its
result only, fixed sets, so an API caller's names never become label values. No secret
is ever passed here.
"""

from __future__ import annotations

import logging

from proxy.errors import ProxyError
from proxy.observability.metrics import Metrics

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
    metrics: Metrics,
    operation: str,
    name: str,
    who: str,
    error: ProxyError | None = None,
    *,
    subject: str = "key",
) -> None:
    """``operation`` on the ``subject`` (``key``, ``team``) named ``name`` by ``who``."""
    result = result_of(error)
    metrics.key_operation(operation, result)
    fields = {"operation": operation, f"{subject}_name": name[:200], "who": who, "result": result}
    if error is not None:
        fields["reason"] = error.code
    level = logging.INFO if error is None else logging.WARNING
    logger.log(level, f"{subject} operation", extra=fields)
