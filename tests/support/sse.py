"""Named SSE events (the Responses and Messages APIs' `event:` + `data:` pairs) read back."""

from __future__ import annotations

from typing import Any

import orjson


def named_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event; asserts that both lines name the same type."""
    events = []
    for block in body.split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        name = event_line.removeprefix("event: ")
        data = orjson.loads(data_line.removeprefix("data: "))
        assert data["type"] == name, block
        events.append((name, data))
    return events
