"""A leaner value class for prometheus-client's multiprocess mode (several workers).

prometheus-client's ``MmapedValue`` takes a process-wide lock and calls ``os.getpid()``
on every write, to notice a fork, then writes through ``MmapedDict.write_value`` (a
dict lookup and a slice assignment). A request moves about a dozen values, so that is a
dozen ``getpid`` syscalls and lock round trips per request (``strace -c`` of a worker
under load: 70,000 ``getpid`` in 4 s). Our workers are single-threaded event loops, and
uvicorn *spawns* them, so neither the lock nor the per-write check buys anything on the
request path.

:class:`LeanMmapedValue` keeps the same files, keys and layout (so ``MultiProcessCollector``
reads it unchanged) and prometheus-client's own start-up and reset code; it writes the
value straight into the mmap at its known offset. A fork is still handled, once, by a
fork hook instead of a check per write: the child reopens its own files (prometheus-
client's reset) before it writes anything.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from prometheus_client import values as _prom_values

__all__ = ["install"]

_pack_value = struct.Struct("dd").pack_into
_PID_CHECK = "_MmapedValue__check_for_pid_change"  # prometheus-client's private name


def install() -> None:
    """Make the metrics created from now on lean, if prometheus-client is in multiprocess
    mode (its value class is mmap-backed); in single-process mode do nothing."""
    base: Any = _prom_values.ValueClass
    if getattr(base, "_lean", False) or not getattr(base, "_multiprocess", False):
        return  # installed already, or single-process
    if not hasattr(base, _PID_CHECK):  # another prometheus-client than we know: keep its
        return
    _prom_values.ValueClass = _lean_class(base)


def _lean_class(base: Any) -> type:
    class LeanMmapedValue(base):  # type: ignore[misc]
        """prometheus-client's MmapedValue without the lock and the pid check per write."""

        _lean = True  # what install() checks

        # Set by the base class (per value, on creation and after a fork).
        _value: float
        _timestamp: float
        _key: str
        _file: Any

        def inc(self, amount: float) -> None:
            value = self._value + amount
            self._value = value
            self._timestamp = 0.0
            self._write(value, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            self._value = value
            self._timestamp = timestamp or 0.0
            self._write(value, self._timestamp)

        def get(self) -> float:
            return self._value

        def _write(self, value: float, timestamp: float) -> None:
            file = self._file
            position = file._positions.get(self._key)
            if position is None:  # first write of this series: the dict lays it out
                file.write_value(self._key, value, timestamp)
                return
            # file._m, not a cached map: the file is remapped when it grows.
            _pack_value(file._m, position, value, timestamp)

    def after_fork_in_child() -> None:
        # prometheus-client's check reopens every value's file under the new pid (it
        # reads nothing of the instance it is called on): run it once, before any write.
        getattr(base, _PID_CHECK)(object.__new__(LeanMmapedValue))

    os.register_at_fork(after_in_child=after_fork_in_child)
    return LeanMmapedValue
