"""The fake upstream's tests share one ``upstream``: the fake in this process on a free
port, streaming without pauses, configured further by the module's ``upstream_options``
fixture (none by default: no key required)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proxy.fake_upstream import FakeUpstreamConfig, FakeUpstreamHandle, run_in_thread


@pytest.fixture
def upstream_options() -> dict[str, Any]:
    return {}


@pytest.fixture
def upstream(upstream_options: dict[str, Any]) -> Iterator[FakeUpstreamHandle]:
    with run_in_thread(FakeUpstreamConfig(port=0, chunk_delay=0, **upstream_options)) as handle:
        yield handle
