"""Letting go of a large structure without stalling the event loop *pure*.

Freeing 100,000 client keys (each a pydantic model with its dicts, strings and digest)
is one C-level cascade of deallocations when their last reference goes: it holds the GIL
throughout, about 60 ms, even from another thread. A reload therefore keeps the retired
keys referenced from a list of its own (``hold``) while the retired pipeline is dropped,
and then empties that list a slice at a time in a thread, handing the GIL over between
slices: each slice frees what only it referenced, well under a millisecond's worth.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RELEASE_SLICE", "release_in_slices"]

RELEASE_SLICE = 500  # objects (a config key and its index entry: ~0.3 ms to free)


def _yield_gil() -> None:
    time.sleep(0)  # lets another thread (the event loop) take the GIL


def release_in_slices(
    hold: list[object], size: int = RELEASE_SLICE, pause: Callable[[], None] = _yield_gil
) -> None:
    """Empty ``hold`` from its end, ``size`` references at a time, ``pause`` after each
    slice. What is referenced elsewhere too stays alive; ``hold`` is this caller's own."""
    while hold:
        del hold[-size:]
        pause()
