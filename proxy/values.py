"""``@value``: the decorator of the request path's value objects.

Immutable to the type checker (``dataclass_transform(frozen_default=True)``: mypy rejects
any assignment to a field), a plain slots dataclass at run time. A frozen dataclass's
``__init__`` sets every field through ``object.__setattr__``; a request through the
memory limiter builds some thirty of them, and that alone was about 13% of its
instructions (docs/performance.md). ``unsafe_hash`` keeps them hashable as frozen ones
are (values with equal fields hash equal; nothing mutates them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

__all__ = ["value"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
