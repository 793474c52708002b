"""Clocks: the manual clock only moves forward; both satisfy the Clock protocol."""

from __future__ import annotations

import pytest

from flatcake.clock import Clock, ManualClock, WallClock


def test_manual_clock_moves_only_forward() -> None:
    c = ManualClock(5.0)
    assert c.now() == 5.0
    assert c.advance(1.5) == 6.5
    c.set(10.0)
    assert c.now() == 10.0
    with pytest.raises(ValueError, match="now_s"):
        c.set(9.0)
    with pytest.raises(ValueError, match="delta_s"):
        c.advance(-0.1)


def test_wall_clock_is_monotonic() -> None:
    c = WallClock()
    a, b = c.now(), c.now()
    assert b >= a


def test_both_are_clocks() -> None:
    assert isinstance(ManualClock(), Clock) and isinstance(WallClock(), Clock)
