"""The model group the end-to-end tests load: one deployment at a fake upstream that
enforces its own limit, so what gets past the proxy is counted where it lands."""

from __future__ import annotations

from typing import Any

MODEL = "gpt-4o-mini"


def strict_model(base_url: str, **deployment: Any) -> list[dict[str, Any]]:
    """A config's ``models``: ``gpt-4o-mini`` on the one deployment ``strict`` at
    ``base_url`` (10 s timeout); ``deployment``: its other fields (``rpm``, ...)."""
    return [
        {
            "name": MODEL,
            "deployments": [{"id": "strict", "base_url": base_url, "timeout": "10s", **deployment}],
        }
    ]
