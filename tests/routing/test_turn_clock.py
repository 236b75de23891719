"""Where a granted turn falls on this process's clock, whatever its reply's delay: the
smallest offset seen between the clocks stands for the true one (injected times)."""

from __future__ import annotations

import pytest

from proxy.routing.turn_clock import DRIFT, TurnClock

LIMITER = 1_700_000_000.0  # the limiter's clock (Redis's TIME) reads this...
HERE = 500.0  # ...when this process's monotonic clock reads this


def test_a_reply_handled_late_does_not_make_its_turn_late() -> None:
    """A turn 2 s ahead whose reply was handled 40 ms later than the quickest reply
    seen: the sleep is 40 ms shorter, so the turn goes when it falls, not 40 ms late."""
    clock = TurnClock(max_correction=0.05)
    quick = clock.sleep("g", LIMITER + 1.0, 1.0, HERE + 0.001)  # a 1 ms reply
    assert quick == pytest.approx(1.0)
    late = clock.sleep("g", LIMITER + 0.5 + 2.0, 2.0, HERE + 0.5 + 0.041)  # a 41 ms one
    slack = 0.54 * DRIFT  # what the smallest offset may have risen by since the first
    assert late == pytest.approx(2.0 - 0.040 + slack, abs=1e-6)
    assert HERE + 0.5 + 0.041 + late >= HERE + 0.5 + 2.0  # the turn, not before


def test_never_sooner_than_the_wait_less_the_correction_nor_later_than_the_wait() -> None:
    """A limiter clock that steps back (a failover to another Redis) makes replies look
    quicker than possible: the turn comes sooner by at most max_correction."""
    clock = TurnClock(max_correction=0.05)
    clock.sleep("g", LIMITER + 1.0, 1.0, HERE)
    stepped_back = clock.sleep("g", LIMITER - 0.5 + 1.0, 1.0, HERE + 0.5 + 0.5)
    assert stepped_back == pytest.approx(1.0 - 0.05)
    assert clock.sleep("g", LIMITER + 5.0, 0.0, HERE + 5.0) == 0.0  # never negative


def test_clocks_drifting_apart_within_drift_never_make_a_turn_early() -> None:
    """The smallest offset may rise DRIFT a second without a quicker reply: this clock
    running 0.5 ms a second faster than the limiter's, 10 s on a late reply's turn is
    not due before it falls (the true offset has grown 5 ms)."""
    clock = TurnClock(max_correction=1.0)
    clock.sleep("g", LIMITER + 1.0, 1.0, HERE)
    true_offset = HERE - LIMITER + 10 * 0.0005
    handled = LIMITER + 10 + true_offset + 0.030  # a reply 30 ms late
    later = clock.sleep("g", LIMITER + 10 + 1.0, 1.0, handled)
    assert handled + later >= LIMITER + 10 + 1.0 + true_offset - 1e-6
    assert later < 1.0  # and still sooner than a sleep of its wait from the late reply


def test_each_limiter_clock_keeps_its_own_offset() -> None:
    """A cluster's slots (one master's clock each), the local fallback and leases are
    measured apart: a quick reply of one says nothing of another's clock."""
    clock = TurnClock(max_correction=0.05)
    clock.sleep("a", LIMITER + 1.0, 1.0, HERE)
    assert clock.sleep("b", 2.0, 1.0, HERE + 0.03) == pytest.approx(1.0)
