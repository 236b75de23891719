"""One paged listing over both sources of client keys: the config's first (in file
order; they are few), then the admin API's by name (*pure*). ``GET /admin/keys``,
``GET /admin/state`` and the admin page page through it the same way."""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.errors import InvalidRequest

__all__ = ["DEFAULT_PER_PAGE", "MAX_PER_PAGE", "Page", "page_of", "parse_page"]

DEFAULT_PER_PAGE = 100
MAX_PER_PAGE = 1000


class Page:
    """``configured`` and ``created``: the names on this page from each source."""

    __slots__ = ("configured", "created", "page", "pages", "per_page", "total")

    def __init__(
        self,
        configured: Sequence[str],
        created: Sequence[str],
        page: int,
        per_page: int,
        total: int,
    ) -> None:
        self.configured = configured
        self.created = created
        self.page = page
        self.per_page = per_page
        self.total = total
        self.pages = max(1, math.ceil(total / per_page))

    def as_dict(self) -> dict[str, int]:
        return {
            "page": self.page,
            "per_page": self.per_page,
            "pages": self.pages,
            "total": self.total,
        }


def page_of(configured: Sequence[str], created: Sequence[str], page: int, per_page: int) -> Page:
    """Page ``page`` (from 1) of ``configured`` followed by ``created`` (names of the API
    that the config also has are expected to be left out by the caller)."""
    start, stop = (page - 1) * per_page, page * per_page
    first = configured[start:stop]
    api_start = max(0, start - len(configured))
    room = per_page - len(first)
    second = created[api_start : api_start + room] if room > 0 else []
    return Page(first, second, page, per_page, len(configured) + len(created))


def parse_page(query: dict[str, str] | object) -> tuple[int, int]:
    """``page`` and ``per_page`` of a query (default 1 and 100, at most 1000 a page)."""
    get = getattr(query, "get")  # noqa: B009 (a mapping or starlette's QueryParams)
    page = _positive(get("page", "1"), "page")
    per_page = min(_positive(get("per_page", str(DEFAULT_PER_PAGE)), "per_page"), MAX_PER_PAGE)
    return page, per_page


def _positive(value: str, param: str) -> int:
    if not value.isdigit() or len(value) > 9 or int(value) < 1:
        raise InvalidRequest(f"'{param}' must be a positive integer.", param=param)
    return int(value)
