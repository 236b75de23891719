"""A request's output cap, as its API shape carries it: the fields that hold it (at any
depth), how many completions it applies to, the lowest an upstream takes, and the fields
that lower it (pure).

A shape names its ``OutputCaps`` (``Shape.output_caps``; None: its requests generate
nothing to cap). A budget reserves the cap (``budgets.py``); one whose owner clamps
(``budget_edge: clamp``, ``limiter/core/edge.py``) may lower it, and the request then
goes with the lowered cap in every field that carries one.
"""

from __future__ import annotations

from typing import Any

from proxy.values import value

__all__ = [
    "ANTHROPIC_CAPS",
    "CHAT_CAPS",
    "COMPLETIONS_CAPS",
    "RESPONSES_CAPS",
    "OutputCaps",
    "completions",
    "least",
    "lowered",
    "with_cap",
]

Path = tuple[str, ...]  # a field's keys from the body's top level down


@value
class OutputCaps:
    """Where a shape's requests carry their output cap. ``sent``: the field a request
    that sets none is sent with (the cap it was reserved for); ``carriers``: every field
    that may carry one (the one an estimate reads first, first); ``count``: the field
    naming how many completions the cap applies to each (OpenAI's ``n``; None: one);
    ``floor``: the lowest cap the upstream takes; ``thinking``: Anthropic's extended
    thinking, whose budget the cap must stay above."""

    sent: Path
    carriers: tuple[Path, ...]
    count: Path | None = None
    floor: int = 1
    thinking: bool = False


CHAT_CAPS = OutputCaps(("max_tokens",), (("max_completion_tokens",), ("max_tokens",)), count=("n",))
COMPLETIONS_CAPS = OutputCaps(("max_tokens",), (("max_tokens",),), count=("n",))
RESPONSES_CAPS = OutputCaps(("max_output_tokens",), (("max_output_tokens",),), floor=16)
ANTHROPIC_CAPS = OutputCaps(("max_tokens",), (("max_tokens",),), thinking=True)


def at(body: dict[str, Any], path: Path) -> object:
    """The value at ``path`` in ``body`` (None where any step is missing or no object)."""
    found: object = body
    for key in path:
        if not isinstance(found, dict):
            return None
        found = found.get(key)
    return found


def completions(body: dict[str, Any], caps: OutputCaps) -> int:
    """How many completions the cap applies to: its ``count`` field when a positive
    integer, else one."""
    n = None if caps.count is None else _cap(at(body, caps.count))
    return n or 1


def least(body: dict[str, Any], caps: OutputCaps) -> int:
    """The lowest cap the upstream takes for this request: its ``floor``; on Anthropic's
    Messages with extended thinking, one more than its ``budget_tokens``."""
    thinking = body.get("thinking") if caps.thinking else None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = _cap(thinking.get("budget_tokens"))
        if budget is not None:
            return budget + 1
    return caps.floor


def lowered(body: dict[str, Any], caps: OutputCaps | None, cap: int) -> dict[str, Any]:
    """The top-level fields to set for the request to go with at most ``cap`` output
    tokens per completion: each carrier that holds a cap above it, or the shape's
    ``sent`` field when the request sets none (a nested one: its top-level object with
    the cap set in it)."""
    if caps is None:
        return {}
    given = [(path, _cap(at(body, path))) for path in caps.carriers]
    if not any(count for _, count in given):
        return with_cap(body, caps.sent, cap)
    fields: dict[str, Any] = {}
    for path, count in given:
        if count is not None and count > cap:
            fields.update(with_cap({**body, **fields}, path, cap))
    return fields


def with_cap(body: dict[str, Any], path: Path, cap: int) -> dict[str, Any]:
    """The top-level field to set for ``path`` to hold ``cap``: the field itself, or its
    top-level object copied with ``cap`` set at its depth (objects made where missing)."""
    head, *rest = path
    if not rest:
        return {head: cap}
    top = body.get(head)
    copied: dict[str, Any] = dict(top) if isinstance(top, dict) else {}
    inner = copied
    for key in rest[:-1]:
        below = inner.get(key)
        inner[key] = dict(below) if isinstance(below, dict) else {}
        inner = inner[key]
    inner[rest[-1]] = cap
    return {head: copied}


def _cap(value: object) -> int | None:
    """``value`` when it is a positive integer (a cap, a count), else None."""
    return value if type(value) is int and value > 0 else None
