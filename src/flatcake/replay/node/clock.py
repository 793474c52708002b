"""Discrete-event core of the replay simulator: an event heap over a simulated clock.

The loop owns a ``ManualClock`` (the same clock type the control plane takes), pops the
earliest event, moves the clock to its time and runs its callback. Ties are broken by
insertion order, so a run is a pure function of its inputs and seed.

Events are plain ``(time_s, seq, callback, arg)`` tuples on a ``heapq``: the simulator
schedules a few events per request, so a tuple heap keeps the per-event cost small.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from flatcake.clock import ManualClock

Callback = Callable[[Any], None]


class EventLoop:
    """Runs callbacks in simulated time order.

    Contract: callbacks run one at a time on the caller's thread; a callback may schedule
    further events at or after the current time (never before: that raises
    ``ValueError``, since it would move the clock backwards).
    """

    __slots__ = ("_heap", "_seq", "clock", "num_events")

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock if clock is not None else ManualClock()
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = 0
        self.num_events = 0

    @property
    def now(self) -> float:
        return self.clock.now()

    def at(self, time_s: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at simulated time ``time_s``."""
        if not time_s >= self.clock.now() or math.isnan(time_s):
            raise ValueError(
                f"EventLoop.at: time_s={time_s!r} is before now={self.clock.now()!r}"
            )
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, callback, arg))

    def after(self, delay_s: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` ``delay_s >= 0`` seconds from now."""
        if not delay_s >= 0.0:
            raise ValueError(f"EventLoop.after: delay_s={delay_s!r} must be >= 0")
        self.at(self.clock.now() + delay_s, callback, arg)

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until_s: float = math.inf) -> None:
        """Process events in time order until the heap is empty or the next is past
        ``until_s``."""
        heap = self._heap
        clock = self.clock
        pop = heapq.heappop
        n = 0
        while heap and heap[0][0] <= until_s:
            time_s, _, callback, arg = pop(heap)
            clock.set(time_s)
            callback(arg)
            n += 1
        self.num_events += n
