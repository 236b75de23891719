"""The one error table (proxy/pipeline/error_table.py): drawn in errors.py's docstring as it is,
holding every exception of the proxy's own that the request path raises, and answering
each as the contract says."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from proxy import errors
from proxy.errors import RateLimited, UpstreamTimeout
from proxy.limiter.base import LimiterUnavailable, StorageError
from proxy.pipeline.affinity import AffinityUnavailable
from proxy.pipeline.error_table import ROWS, contract_error, drawn
from proxy.request.call import ClientGone
from proxy.routing.dispatcher import GateClosed
from proxy.upstream.forward import TransportFailure

PACKAGE = Path(errors.__file__).parent
# The request path: the endpoint, the pipeline and every stage it calls.
REQUEST_PATH = (
    "api/forwarding.py",
    "pipeline",
    "request",
    "catalog",
    "costs.py",
    "limiter",
    "routing",
    "upstream",
    "translate",
    "shapes",
    "providers",
)


def _modules() -> list[Path]:
    paths = [PACKAGE / p for p in REQUEST_PATH]
    return [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]


def _raised(path: Path) -> set[type[BaseException]]:
    """The proxy's own exception classes ``path`` raises or makes (``raise X``, ``X(...)``
    anywhere: a helper that returns it, a future's ``set_exception``)."""
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    module = vars(importlib.import_module(name))
    found: set[type[BaseException]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target: ast.expr = node.exc
        elif isinstance(node, ast.Call):
            target = node.func
        else:
            continue
        cls = module.get(target.id) if isinstance(target, ast.Name) else None
        proxys = isinstance(cls, type) and cls.__module__.startswith("proxy.")
        if proxys and issubclass(cls, BaseException):
            found.add(cls)
    return found


def test_errors_docstring_draws_the_table_row_for_row() -> None:
    doc = errors.__doc__ or ""
    lines = [line.strip() for line in doc.splitlines()]
    start = lines.index(drawn()[0])
    assert lines[start : start + len(drawn())] == drawn()
    assert lines[start + len(drawn())] == ""  # and no row the table does not have


@pytest.mark.slow
def test_every_exception_the_request_path_raises_is_in_the_table() -> None:
    rows = [r.raised for r in ROWS[:-1]]  # the last row: anything else, a bug
    raised = {cls for path in _modules() for cls in _raised(path)}
    assert StorageError in raised and GateClosed in raised  # (the scan finds them)
    missing = {cls.__name__ for cls in raised if not any(issubclass(cls, r) for r in rows)}
    assert not missing


@pytest.mark.parametrize(
    ("exc", "status", "code", "retry_after"),
    [
        (StorageError("down"), 503, "limiter_unavailable", "1"),
        (LimiterUnavailable(), 503, "limiter_unavailable", "1"),
        (AffinityUnavailable("resp_1", "previous_response_id"), 503, "affinity_unavailable", "1"),
        (GateClosed(RateLimited("no", code="key_rpm", retry_after=2.5)), 429, "key_rpm", "3"),
        (GateClosed(StorageError("down")), 503, "limiter_unavailable", "1"),
        (TransportFailure(UpstreamTimeout("slow"), "timeout"), 504, "upstream_timeout", None),
        (ClientGone(), 500, "internal_error", None),  # converted where raised: never here
        (KeyError("bug"), 500, "internal_error", None),
    ],
)
def test_each_row_answers_as_the_contract_says(
    exc: BaseException, status: int, code: str, retry_after: str | None
) -> None:
    error = contract_error(exc)
    assert (error.status, error.code) == (status, code)
    assert error.headers().get("retry-after") == retry_after


def test_an_affinity_failure_names_the_response_it_could_not_find() -> None:
    error = contract_error(AffinityUnavailable("resp_1", "previous_response_id"))
    assert error.param == "previous_response_id" and "'resp_1'" in error.message
