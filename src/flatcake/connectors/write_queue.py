"""The worker's write queue: one daemon thread runs store tasks in order, fed through a
bounded queue by the engine thread (``WorkerSide.end_step``), drained with a deadline
(``WorkerSide.close``).

A daemon, so an exiting process never hangs on it; ``drain`` bounds the wait and hands
back what never started. Engine thread: ``submit`` and ``drain``; the writer thread:
the ``run`` callable.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from flatcake.plan.tasks import StoreTask


class WriteQueue:
    """One daemon thread that runs store tasks in order from a bounded queue.

    A daemon, so an exiting process never hangs on it: ``drain`` bounds the wait.
    ``on_start`` runs first in the thread (``cio.affinity.ThreadCpus.pin``)."""

    def __init__(self, run: Callable[[StoreTask], None], max_pending: int,
                 on_start: Callable[[], None] = lambda: None) -> None:
        self._run = run
        self._on_start = on_start
        self._queue: queue.Queue[StoreTask | None] = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._loop, name="flatcake-write",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self._on_start()
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                self._run(task)
            finally:
                self._queue.task_done()

    def submit(self, task: StoreTask) -> bool:
        """Queue ``task``; ``False`` when the queue is full (never blocks)."""
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            return False
        return True

    def drain(self, timeout_s: float) -> tuple[list[StoreTask], bool]:
        """Wait up to ``timeout_s`` for every queued task, then stop the thread; returns
        within ``timeout_s`` (plus a moment for the thread to see the stop when the
        queue emptied).

        Returns the tasks that never started (removed from the queue) and whether
        the thread has stopped (``False``: a task is still running)."""
        deadline = time.monotonic() + timeout_s
        q = self._queue
        with q.all_tasks_done:
            q.all_tasks_done.wait_for(lambda: q.unfinished_tasks == 0, timeout_s)
        dropped: list[StoreTask] = []
        while True:
            try:
                task = q.get_nowait()
            except queue.Empty:
                break
            q.task_done()
            if task is not None:
                dropped.append(task)
        q.put(None)
        idle = q.unfinished_tasks == 1  # only the stop: the thread is between tasks
        self._thread.join(timeout=max(deadline - time.monotonic(), 0.5 if idle else 0.0))
        return dropped, not self._thread.is_alive()
