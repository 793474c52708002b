"""The scheduler half's books of the turn stores in flight: planned, handed to the
workers, and reported durable by each of them (engine-neutral, no torch).

A store is in flight from ``add`` (its address allocated) until every worker reported
it (``done``), when the host completes it in the books. Which keys are being written is
the books' own (``ControlPlane.store_in_flight``, read by ``plan.requests.servable``).
"""

from __future__ import annotations

import logging

from flatcake.plan.tasks import StoreDone, StoreTask

logger = logging.getLogger(__name__)


class StoreBooks:
    """Stores in flight for ``world_size`` workers that each report every store."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._new: list[StoreTask] = []  # planned, not yet in a step
        # seg id -> the task and its workers' reports so far
        self._stores: dict[int, tuple[StoreTask, list[StoreDone]]] = {}

    def add(self, task: StoreTask) -> None:
        """A store planned: it goes to the workers with the next step."""
        self._new.append(task)
        self._stores[task.plan.segment.segment_id] = (task, [])

    def take_new(self) -> list[StoreTask]:
        """The stores planned since the last call (this step's)."""
        out, self._new = self._new, []
        return out

    def writing(self) -> set[str]:
        """Requests with a store in flight."""
        return {task.request_id for task, _reports in self._stores.values()}

    def done(self, report: StoreDone) -> tuple[StoreTask, bool, list[StoreDone]] | None:
        """One worker's report of a store. Once every worker reported it: the task,
        whether all of them wrote it, and their reports; None before."""
        entry = self._stores.get(report.segment_id)
        if entry is None:
            logger.warning("report for unknown store of segment %d", report.segment_id)
            return None
        task, reports = entry
        reports.append(report)
        if len(reports) < self.world_size:
            return None
        del self._stores[report.segment_id]
        return task, all(r.ok for r in reports), reports

    def abandon(self) -> tuple[list[tuple[StoreTask, int]], list[StoreTask]]:
        """Every store in flight, forgotten (its engine is gone): those handed to the
        workers (they may still write them), each with its workers' reports so far, and
        those not yet in a step."""
        new = {task.plan.segment.segment_id for task in self._new}
        handed = [(task, len(reports)) for seg_id, (task, reports) in self._stores.items()
                  if seg_id not in new]
        out = handed, self._new
        self._stores.clear()
        self._new = []
        return out

    def __len__(self) -> int:
        """Stores planned and not yet reported by every worker."""
        return len(self._stores)

    def has_pending(self) -> bool:
        return bool(self._stores) or bool(self._new)
