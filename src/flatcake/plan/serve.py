"""The books' verbs turned into executor tasks, the same for every host.

``FlatCakeStore`` (books + executor in one process) and the vLLM scheduler half (books
only, tasks sent to the workers) both build their tasks here::

    load_task      prepare_load with the stream planner (whole SSD segments, for the
                   checksum) -> LoadTask; checks carry no crcs: the executor fills them
                   in from its own files (tensor-parallel workers hold other bytes);
                   refills: memory copies the executor writes from the restored blocks
    store_task     a StorePlan and the paged KV slots of its blocks -> StoreTask
    reclaim_tasks  the books' ReclaimActions -> file cuts and file drops (or moves
                   into quarantine)
    by_medium      request blocks of a hit per medium (what a load delivered)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit
from flatcake.control.plane import ControlPlane
from flatcake.control.types import FileCut, LoadPlan, ReclaimAction, StorePlan
from flatcake.plan.stream import StreamPlanner
from flatcake.plan.tasks import FileDrop, LoadTask, StoreTask


def load_task(control: ControlPlane, request_id: Hashable, hit: PrefixHit,
              block_ids: Sequence[int], first_block: int = 0) -> tuple[LoadTask, LoadPlan]:
    """Pin ``hit`` for a restore (``prepare_load``) and describe it for the executor:
    request blocks ``[first_block, hit.num_blocks)`` into slots ``block_ids``."""
    if len(block_ids) < hit.num_blocks:
        raise ValueError(f"request {request_id!r}: {len(block_ids)} block ids for "
                         f"{hit.num_blocks} hit blocks")
    planner = StreamPlanner({})
    plan = control.prepare_load(request_id, hit, planner=planner, refill=True)
    stream_request = tuple(r if r >= first_block else -1 for r in planner.stream_request)
    where = {run.segment.segment_id: (int(run.segment.file_id or 0),
                                      int(run.segment.file_offset or 0))
             for run in hit.runs if run.segment.medium == Medium.SSD}
    check_files = tuple((c.tag, *where[c.tag]) for c in planner.checks)
    start_of = {run.segment.segment_id: run.prefix_start for run in hit.runs}
    refills = tuple((home.segment_id, start_of[home.segment_id], home.num_blocks,
                     int(copy.offset), copy.total_bytes) for home, copy in plan.refills)
    task = LoadTask(str(request_id), plan.read_plan, stream_request, tuple(planner.checks),
                    check_files, tuple(int(b) for b in block_ids[:hit.num_blocks]),
                    hit.num_blocks, first_block, sync=not hit.needs_ssd, refills=refills)
    return task, plan


def store_task(request_id: str, plan: StorePlan, block_ids: Sequence[int]) -> StoreTask:
    """The write of ``plan``'s segment from the request's slots ``block_ids`` (one per
    request block; the segment's are taken from ``plan.first_block`` on)."""
    first = plan.first_block
    return StoreTask(request_id, plan, tuple(
        int(b) for b in block_ids[first:first + plan.segment.num_blocks]))


def reclaim_tasks(actions: Iterable[ReclaimAction]) -> tuple[list[FileCut], list[FileDrop]]:
    """The disk side of the books' actions: files to cut, files to delete."""
    cuts: list[FileCut] = []
    drops: list[FileDrop] = []
    for action in actions:
        cuts.extend(action.cut_files)
        drops.extend(FileDrop(f, action.quarantine) for f in action.file_ids)
    return cuts, drops


def by_medium(hit: PrefixHit, start: int, end: int) -> tuple[int, int]:
    """Request blocks ``[start, end)`` of ``hit``: (in memory, on SSD)."""
    mem = ssd = 0
    for run in hit.runs:
        n = max(0, min(run.prefix_start + run.num_blocks, end) - max(run.prefix_start, start))
        if run.segment.medium == Medium.MEMORY:
            mem += n
        else:
            ssd += n
    return mem, ssd
