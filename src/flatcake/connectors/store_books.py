"""The scheduler half's books of the turn stores in flight: planned, handed to the
workers, and reported durable by each of them (engine-neutral, no torch).

A store is in flight from ``add`` (its address allocated) until every worker reported
it (``done``); its keys count as pending meanwhile, so a lookup of the same prefix asks
the engine to try again rather than recompute it, and a second request does not plan
the same blocks again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from flatcake.plan.tasks import StoreDone, StoreTask

logger = logging.getLogger(__name__)


class StoreBooks:
    """Stores in flight for ``world_size`` workers that each report every store."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._new: list[StoreTask] = []  # planned, not yet in a step
        self._stores: dict[int, tuple[StoreTask, list[bool]]] = {}  # seg id -> task, oks
        self._pending_keys: Counter[bytes] = Counter()  # keys of stores in flight

    def add(self, task: StoreTask) -> None:
        """A store planned: it goes to the workers with the next step."""
        self._new.append(task)
        self._stores[task.plan.segment.segment_id] = (task, [])
        self._pending_keys.update(task.plan.segment.keys)

    def take_new(self) -> list[StoreTask]:
        """The stores planned since the last call (this step's)."""
        out, self._new = self._new, []
        return out

    def pending(self, key: bytes) -> bool:
        """Whether a store in flight writes ``key``."""
        return bool(self._pending_keys.get(key))

    def all_pending(self, keys: Iterable[bytes]) -> bool:
        return all(self._pending_keys.get(k) for k in keys)

    def writing(self) -> set[str]:
        """Requests with a store in flight."""
        return {task.request_id for task, _oks in self._stores.values()}

    def done(self, report: StoreDone) -> tuple[StoreTask, bool] | None:
        """One worker's report of a store. Once every worker reported it: the task and
        whether all of them wrote it (its keys stop being pending); None before."""
        entry = self._stores.get(report.segment_id)
        if entry is None:
            logger.warning("report for unknown store of segment %d", report.segment_id)
            return None
        task, oks = entry
        oks.append(report.ok)
        if len(oks) < self.world_size:
            return None
        del self._stores[report.segment_id]
        for key in task.plan.segment.keys:
            n = self._pending_keys[key] - 1
            if n:
                self._pending_keys[key] = n
            else:
                del self._pending_keys[key]
        return task, all(oks)

    def __len__(self) -> int:
        """Stores planned and not yet reported by every worker."""
        return len(self._stores)

    def has_pending(self) -> bool:
        return bool(self._stores) or bool(self._new)
