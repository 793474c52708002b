"""Loads in flight on the executor's pools, so that closing waits for them within a
deadline instead of without one (``Executor.close``).

A load counts from its submission until its last future settles: its result, its
exception, or its cancellation (a pool shut down before it started)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any


class InFlight:
    """Futures submitted and not yet settled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def track(self, fut: Future[Any]) -> Future[Any]:
        """Count ``fut`` until it settles; returns it."""
        with self._cond:
            self._count += 1
        fut.add_done_callback(self._settled)
        return fut

    def _settled(self, _fut: Future[Any]) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every tracked future; returns how many are
        still unsettled (0: all settled)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.wait_for(lambda: self._count == 0,
                                max(deadline - time.monotonic(), 0.0))
            return self._count
