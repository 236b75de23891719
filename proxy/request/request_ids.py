"""Request ids: every answer's ``x-request-id`` (pure).

This process's random prefix and a counter, 32 hex digits like a uuid4 but with no
syscall and no UUID object per request. The prefix keeps them unique across workers and
replicas (they name leases in the shared Redis).
"""

from __future__ import annotations

import itertools
import os

__all__ = ["HEADER", "new_request_id"]

HEADER = "x-request-id"

_id_prefix = os.urandom(8).hex()
_id_counter = itertools.count(1)


def new_request_id() -> str:
    return f"req_{_id_prefix}{next(_id_counter):016x}"


def _new_id_prefix() -> None:  # a forked child must not repeat its parent's ids
    global _id_prefix
    _id_prefix = os.urandom(8).hex()


os.register_at_fork(after_in_child=_new_id_prefix)
