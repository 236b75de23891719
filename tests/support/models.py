"""The model group the end-to-end tests load: one deployment at a fake upstream that
enforces its own limit, so what gets past the proxy is counted where it lands."""

from __future__ import annotations

from typing import Any

from proxy.fake_upstream import FakeUpstreamConfig

MODEL = "gpt-4o-mini"
# The strict upstream: its sliding window, seconds, and the requests it takes in any one.
WINDOW = 10.0
LIMIT = 100
RATE = LIMIT / WINDOW  # 10 a second
STRICT_RPM = int(RATE * 60)  # its limit as a deployment's rpm


def strict_upstream_config(**options: Any) -> FakeUpstreamConfig:
    """The fake upstream taking ``LIMIT`` requests in any ``WINDOW`` (20 ms each), on a
    free port; ``options``: its other fields."""
    return FakeUpstreamConfig(port=0, rpm=LIMIT, window=WINDOW, latency=0.02, **options)


def strict_model(base_url: str, **deployment: Any) -> list[dict[str, Any]]:
    """A config's ``models``: ``gpt-4o-mini`` on the one deployment ``strict`` at
    ``base_url`` (10 s timeout); ``deployment``: its other fields (``rpm``, ...)."""
    return [
        {
            "name": MODEL,
            "deployments": [{"id": "strict", "base_url": base_url, "timeout": "10s", **deployment}],
        }
    ]
