"""A request's output cap, per API shape: the fields that carry it, how many completions
it applies to, the lowest an upstream takes, and the fields that lower it (pure).

A budget reserves the cap (``budgets.py``); one whose owner clamps (``budget_edge:
clamp``, ``limiter/core/edge.py``) may lower it, and the request then goes with the
lowered cap in every field that carries one.
"""

from __future__ import annotations

from typing import Any

from proxy.shapes.tokens import choices

__all__ = ["CAP_FIELDS", "clampable", "completions", "least", "lowered"]

# The field a request's output cap is sent in when it sets none, per API shape
# (``Shape.name``). A request of a shape not named here that sets no cap is reserved at
# the default cap but sent as it is (docs/limiter.md), and is never clamped.
CAP_FIELDS = {
    "chat/completions": "max_tokens",
    "completions": "max_tokens",
    "responses": "max_output_tokens",
    "messages": "max_tokens",
}
# Every field a shape's request may carry its cap in (chat: the newer one first, as its
# estimate reads them): a lowered cap lowers each one it sets.
_CARRIERS = {
    "chat/completions": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}
# OpenAI's Responses API refuses a max_output_tokens below 16.
_LEAST = {"responses": 16}
# Anthropic's: extended thinking's budget must be below max_tokens.
_THINKING = "thinking"


def clampable(shape: str) -> bool:
    """Whether a request of ``shape`` (``Shape.name``) can be sent with a lower cap."""
    return shape in _CARRIERS


def completions(body: dict[str, Any], shape: str) -> int:
    """How many completions the cap applies to: OpenAI's ``n`` on chat and
    completions, else one."""
    return choices(body) if shape in ("chat/completions", "completions") else 1


def least(body: dict[str, Any], shape: str) -> int:
    """The lowest cap the upstream takes for this request: 16 on the Responses API; on
    Anthropic's Messages with extended thinking, one more than its ``budget_tokens``;
    else 1."""
    thinking = body.get(_THINKING) if shape == "messages" else None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            return budget + 1
    return _LEAST.get(shape, 1)


def lowered(body: dict[str, Any], shape: str, cap: int) -> dict[str, int]:
    """The fields to set for the request to go with at most ``cap`` output tokens per
    completion: each field that carries a cap above it, or the shape's own field when
    the request sets none."""
    carriers = _CARRIERS.get(shape, ())
    given = [field for field in carriers if _count(body.get(field))]
    if not given:
        return {CAP_FIELDS[shape]: cap} if shape in CAP_FIELDS else {}
    return {field: cap for field in given if body[field] > cap}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
