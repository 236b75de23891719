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

:func:`writer` takes the metric wrappers off the request path too: ``Counter.inc``,
``Gauge.inc`` and ``Histogram.observe`` check on every call what is settled once a
child exists (its label values, an exemplar, a gauge's mode) and a histogram looks its
bucket up in a Python loop. The writer calls the child's values directly, and a bisect
finds the bucket; in single-process mode (one worker) it adds to the value without the
lock ``MutexValue.inc`` takes on every write.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import values as _prom_values

__all__ = ["install", "writer"]

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


def writer(child: Any) -> Callable[[float], None]:
    """``child.inc`` (a counter's or a gauge's labelled child) or ``child.observe`` (a
    histogram's), writing its values directly; the child's own method where its values
    are not laid out as this prometheus-client's are. No check of the amount: a counter's
    caller must not pass a negative one."""
    buckets = getattr(child, "_buckets", None)
    if buckets is not None:
        bounds, total = getattr(child, "_upper_bounds", None), getattr(child, "_sum", None)
        if bounds is None or total is None or len(bounds) != len(buckets):
            return child.observe  # type: ignore[no-any-return]
        return _HistogramWriter(_adder(total), tuple(bounds), tuple(_adder(b) for b in buckets))
    if getattr(child, "_is_most_recent", False) or getattr(child, "_value", None) is None:
        return child.inc  # type: ignore[no-any-return]
    return _adder(child._value)


def _adder(value: Any) -> Callable[[float], None]:
    """``value.inc``; in one process (a ``MutexValue``) without its lock."""
    if type(value) is _prom_values.MutexValue:
        return _UnlockedAdd(value)
    return value.inc  # type: ignore[no-any-return]


class _UnlockedAdd:
    """``MutexValue.inc`` without its lock: a worker's metrics are written from its event
    loop's thread only, and a reader (the exposition, under the lock) sees a float
    assigned whole either way."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        self._target = target

    def __call__(self, amount: float) -> None:
        self._target._value += amount


class _HistogramWriter:
    """``Histogram.observe``: the sum, then the first bucket whose bound is at least the
    amount (the last bound is +Inf, so there always is one)."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(
        self,
        add_to_sum: Callable[[float], None],
        bounds: tuple[float, ...],
        buckets: tuple[Callable[[float], None], ...],
    ) -> None:
        self._sum, self._bounds, self._buckets = add_to_sum, bounds, buckets

    def __call__(self, amount: float) -> None:
        self._sum(amount)
        self._buckets[bisect_left(self._bounds, amount)](1.0)
