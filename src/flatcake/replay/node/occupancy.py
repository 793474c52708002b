"""Time-weighted occupancy of the simulated node: per-worker queue lengths and busy time.

Both are step functions of simulated time, updated by the event loop when they change:

* ``LevelTracker``: a worker's queue length (requests that arrived at it and have not
  started their prefill), kept as seconds spent at each length, so the mean and any
  percentile over time are exact;
* ``BusyTracker``: seconds during which a GPU is busy (prefilling or holding a decode
  batch), so ``busy / span`` is its busy fraction.

Owned by the simulator's single thread.
"""

from __future__ import annotations

import math

import numpy as np


class LevelTracker:
    """Seconds spent at each integer level (levels >= 0)."""

    __slots__ = ("_since_s", "level", "seconds")

    def __init__(self) -> None:
        self.level = 0
        self._since_s = 0.0
        self.seconds = np.zeros(16)

    def change(self, now_s: float, delta: int) -> None:
        self._account(now_s)
        self.level += delta
        if self.level < 0:
            raise ValueError(f"LevelTracker: level went negative ({self.level})")

    def _account(self, now_s: float) -> None:
        if self.level >= len(self.seconds):
            grown = np.zeros(max(2 * len(self.seconds), self.level + 1))
            grown[:len(self.seconds)] = self.seconds
            self.seconds = grown
        self.seconds[self.level] += now_s - self._since_s
        self._since_s = now_s

    def close(self, now_s: float) -> None:
        self._account(now_s)


def level_stats(trackers: list[LevelTracker]) -> tuple[float, float]:
    """Mean and time-weighted P99 of the level over all trackers together."""
    size = max((len(t.seconds) for t in trackers), default=1)
    total = np.zeros(size)
    for t in trackers:
        total[:len(t.seconds)] += t.seconds
    s = float(total.sum())
    if s <= 0:
        return math.nan, math.nan
    levels = np.arange(size)
    mean = float((levels * total).sum() / s)
    cdf = np.cumsum(total) / s
    p99 = float(levels[int(np.searchsorted(cdf, 0.99))])
    return mean, p99


class BusyTracker:
    """Busy seconds of a resource with several overlapping holders (prefill, decode)."""

    __slots__ = ("_since_s", "busy_s", "holders")

    def __init__(self) -> None:
        self.holders = 0
        self.busy_s = 0.0
        self._since_s = 0.0

    def hold(self, now_s: float) -> None:
        if self.holders == 0:
            self._since_s = now_s
        self.holders += 1

    def release(self, now_s: float) -> None:
        self.holders -= 1
        if self.holders == 0:
            self.busy_s += now_s - self._since_s
        elif self.holders < 0:
            raise ValueError("BusyTracker: released more than held")
