"""The plans: what to read and write, pure (no torch, no file I/O).

``layout`` (a segment's on-disk geometry), ``reads`` (merged layer-major read commands
from a hit), ``stream`` (the data path's planner: SSD runs widened to whole segments
for the checksum), ``bulk`` (the replay's vectorised twins of ``reads`` and ``stream``,
tied to them by property tests) and ``tasks`` (the load and store tasks the executor
runs, picklable).
"""

from __future__ import annotations

from flatcake.lazy import lazy_getattr

_WHERE = {
    "ALIGN": "layout",
    "KEY_BYTES": "layout",
    "SegmentLayout": "layout",
    "align_up": "layout",
    "segment_header_bytes": "layout",
    "CopyOp": "reads",
    "LayerPlan": "reads",
    "Piece": "reads",
    "ReadOp": "reads",
    "ReadPlan": "reads",
    "plan_reads": "reads",
    "StreamCheck": "stream",
    "StreamPlanner": "stream",
    "SegmentCache": "bulk",
    "plan_totals": "bulk",
    "stream_totals": "bulk",
    "FileDrop": "tasks",
    "LoadDone": "tasks",
    "LoadTask": "tasks",
    "StepPlan": "tasks",
    "StoreDone": "tasks",
    "StoreTask": "tasks",
    "WorkerReport": "tasks",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
