"""Clocks for the control plane.

The control plane never reads the time itself: every component that needs "now" (last
access of a session, wait time of a restore) takes a ``Clock`` in its constructor, so
the same objects run on the wall clock inside a store or an engine, and on a simulated
clock inside the replay simulator and the tests.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of the current time in seconds.

    Contract: ``now()`` never goes backwards; the epoch is arbitrary (only differences
    matter). Called from whichever thread owns the control plane.
    """

    def now(self) -> float: ...


class WallClock:
    """Monotonic wall time (``time.monotonic``), for real stores and engines."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock moved by hand: tests and the replay simulator's event loop.

    ``set`` and ``advance`` refuse to move time backwards, so a simulation bug shows as
    an error instead of a negative wait.
    """

    __slots__ = ("_now",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def set(self, now_s: float) -> None:
        """Jump to ``now_s`` seconds (must not be earlier than the current time)."""
        if now_s < self._now:
            raise ValueError(f"ManualClock.set: now_s={now_s!r} is before current {self._now!r}")
        self._now = float(now_s)

    def advance(self, delta_s: float) -> float:
        """Move forward by ``delta_s >= 0`` seconds; returns the new time."""
        if delta_s < 0:
            raise ValueError(f"ManualClock.advance: delta_s={delta_s!r} must be >= 0")
        self._now += delta_s
        return self._now
