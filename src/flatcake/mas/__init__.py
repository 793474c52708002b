"""FC-MAS: memory-aware restore scheduling (ready queue + SSD-preparing queue)."""

from flatcake.mas.queues import PRIORITY_UNIT_BYTES, ReadyQueue, RestoreRequest, priority
from flatcake.mas.scheduler import MasScheduler, SchedulerStats

__all__ = [
    "PRIORITY_UNIT_BYTES",
    "MasScheduler",
    "ReadyQueue",
    "RestoreRequest",
    "SchedulerStats",
    "priority",
]
