"""The plans: what to read and write, pure (no torch, no file I/O).

``reads`` (merged layer-major read commands from a hit), ``stream`` (the data path's
planner: SSD runs read over their wanted blocks, checked by block crcs), ``bulk`` (the replay's
vectorised twins of ``reads`` and ``stream``, tied to them by property tests), ``tasks``
(the load and store tasks the executor runs, picklable) and ``requests`` (the request
protocol every host drives: the servable hit, the load with its FC-MAS request, its
completion and damage settling, the verbs turned into those tasks).

The floor above the books: the plans import ``control`` (its index, addresses and
verbs) and the leaves (the segment layout in ``flatcake.layout``, the read plan's value
types in ``flatcake.readplan``, re-exported here), never the other way round.
"""

from __future__ import annotations

from flatcake.plan.bulk import SegmentCache, plan_totals, stream_totals
from flatcake.plan.reads import plan_reads
from flatcake.plan.stream import StreamCheck, StreamPlanner
from flatcake.plan.tasks import (
    FileDrop,
    LoadDone,
    LoadTask,
    StepPlan,
    StoreDone,
    StoreTask,
    WorkerReport,
)
from flatcake.readplan import CopyOp, LayerPlan, Piece, ReadOp, ReadPlan

__all__ = [
    "CopyOp",
    "FileDrop",
    "LayerPlan",
    "LoadDone",
    "LoadTask",
    "Piece",
    "ReadOp",
    "ReadPlan",
    "SegmentCache",
    "StepPlan",
    "StoreDone",
    "StoreTask",
    "StreamCheck",
    "StreamPlanner",
    "WorkerReport",
    "plan_reads",
    "plan_totals",
    "stream_totals",
]
