"""The request protocol: how a host drives the books for one request, written once.

Every host (``FlatCakeStore``, the vLLM scheduler half and its cluster side, the SGLang
backend through the store, the replay's FlatCake and its cluster variant) goes through
these steps with its own queues, threads or simulated clock around them; none re-codes
them::

    hit        servable(control, keys, engine_blocks)
                 -> Servable: the hit the books can serve now (never a damaged segment),
                    and ``wait`` when a store in flight reaches past both the hit and
                    what the engine holds (ask again once it is durable rather than
                    recompute it)
    load       load(control, request_id, hit, block_ids, first_block, remote)
                 -> (LoadTask, LoadPlan): sessions pinned, whole SSD segments read (the
                    checksum), memory copies to refill, then the runs other nodes hold;
               restore_request(control, task, plan, arrival)
                 -> the FC-MAS request: local SSD bytes + remote blocks, one formula
                    (``ControlPlane.restore_request``)
    finish     finish_load(control, request_id, reports)
                 -> loaded prefix (every worker's), memory copies every worker wrote,
                    damaged segments marked (with whether their file header is damaged)
    settle     settle(control) -> [ReclaimAction]: cuts at damage (or drops with
                    quarantine), reclaim; the host applies them (files, events, index)
    store      control.prepare_store(session_id, keys, signals) -> StorePlan | None:
                    nothing when every new block is already being written by another
                    request's store; the shared-prefix signal taken at the block really
                    written (hosts pass a function of its position)
               begin_store(control, session_id, keys, signals) -> StoreBegun: settle,
                    then (unless the session is being cut: wait, begin again) the
                    store's plan and the reclaim actions that made room, in one step
                    (one call for a store attached to the node service)
               end_store(control, plan, ok, copied) -> StoreEnded: the memory copy
                    (when written and not told yet), the store completed (published
                    only when ``ok``: durable), the window rows it released, a failed
                    SSD store's file end: the second and last call of an attached store

The verbs turned into executor tasks, the same for every host that has an executor
(``FlatCakeStore`` in one process, the vLLM scheduler half sending them to its
workers)::

    load_task      prepare_load with the stream planner (whole SSD segments, for the
                   checksum) -> LoadTask; checks carry no crcs: the executor fills them
                   in from its own files (tensor-parallel workers hold other bytes);
                   refills: memory copies the executor writes from the restored blocks
    store_task     a StorePlan and the paged KV slots of its blocks -> StoreTask
    reclaim_tasks  the books' ReclaimActions -> file cuts and file drops (or moves
                   into quarantine)
    by_medium      request blocks of a hit per medium (what a load delivered)

Pure: the books and the plans only, no I/O; single-threaded like the books (the host
serialises calls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace

from flatcake.control.address import Medium
from flatcake.control.index import EMPTY_HIT, PrefixHit, trim_hit
from flatcake.control.plane import ControlPlane
from flatcake.control.scheduler import RestoreRequest
from flatcake.control.types import FileCut, LoadPlan, ReclaimAction, StorePlan, WindowRelease
from flatcake.plan.remote import RemoteRun, trim_runs
from flatcake.plan.stream import StreamPlanner
from flatcake.plan.tasks import FileDrop, LoadDone, LoadTask, StoreTask

logger = logging.getLogger(__name__)

__all__ = ["FileWork", "Finished", "Servable", "StoreBegun", "StoreEnded", "begin_store",
           "by_medium", "end_store", "finish_load", "load", "load_task", "reclaim_tasks",
           "remote_blocks", "restore_request", "servable", "settle", "store_task"]


@dataclass(frozen=True, slots=True)
class Servable:
    """What a lookup can serve now.

    Attributes:
        hit: the servable prefix hit.
        wait: a store in flight writes the blocks right after ``hit`` and reaches past
            what the engine holds: the host asks again once it is durable.
    """

    hit: PrefixHit
    wait: bool


def servable(control: ControlPlane, keys: Sequence[bytes], engine_blocks: int = 0
             ) -> Servable:
    """The servable hit of ``keys`` and whether to wait for a store in flight
    (``engine_blocks``: request blocks the engine already holds itself)."""
    hit = control.lookup(keys)
    end = hit.num_blocks
    while end < len(keys) and control.store_in_flight(keys[end]):
        end += 1
    return Servable(hit, end > max(hit.num_blocks, engine_blocks))


def load(control: ControlPlane, request_id: Hashable, hit: PrefixHit,
         block_ids: Sequence[int], first_block: int = 0,
         remote: Sequence[RemoteRun] = ()) -> tuple[LoadTask, LoadPlan]:
    """Pin ``hit`` for a restore into slots ``block_ids`` from request block
    ``first_block`` (what the engine holds before it is never written), then the runs
    ``remote`` other nodes hold after it (trimmed to start past both).

    When the engine's own prefix reaches past the local hit, the local part loads
    nothing (an empty hit; its first block the engine's prefix). A task with remote
    runs is async (it takes a restore slot on the worker)."""
    start = max(hit.num_blocks, first_block)
    far = trim_runs(remote, start) if remote else ()
    end = far[-1].end if far else start
    if len(block_ids) < end:
        raise ValueError(f"request {request_id!r}: {len(block_ids)} block ids for {end} "
                         "hit blocks")
    if first_block <= hit.num_blocks:
        task, plan = load_task(control, request_id, hit, block_ids, first_block)
    else:
        task, plan = load_task(control, request_id, EMPTY_HIT, block_ids)
        task = replace(task, num_blocks=start, first_block=start,
                       block_ids=tuple(int(b) for b in block_ids[:start]))
    if far:
        task = replace(task, block_ids=tuple(int(b) for b in block_ids[:end]), remote=far,
                       sync=False)
    return task, plan


def remote_blocks(task: LoadTask) -> int:
    """Blocks of ``task`` that other nodes send."""
    return sum(r.count for r in task.remote)


def restore_request(control: ControlPlane, task: LoadTask, plan: LoadPlan,
                    arrival_time: float) -> RestoreRequest:
    """The load as FC-MAS sees it (``ControlPlane.restore_request``)."""
    return control.restore_request(plan.request_id, arrival_time, plan, remote_blocks(task))


@dataclass(frozen=True, slots=True)
class Finished:
    """A load's outcome once every worker reported it.

    Attributes:
        num_blocks_loaded: request blocks in the paged KV on every worker.
        failed_segments: segments some worker found damaged (or could not read).
        newly_damaged: those the books marked damaged now (still published).
    """

    num_blocks_loaded: int
    failed_segments: tuple[int, ...]
    newly_damaged: tuple[int, ...]


def finish_load(control: ControlPlane, request_id: Hashable,
                reports: Sequence[LoadDone]) -> Finished:
    """Every worker reported the load: unpin it (a memory copy serves only if every
    worker wrote its share) and mark the segments that failed their checksum."""
    if not reports:
        raise ValueError(f"request {request_id!r}: no load reports")
    loaded = min(r.num_blocks_loaded for r in reports)
    failed = tuple(dict.fromkeys(s for r in reports for s in r.failed_segments))
    bad_headers = {f for r in reports for f in r.damaged_headers}
    refilled = set.intersection(*(set(r.refilled) for r in reports))
    control.complete_load(request_id, refilled)
    marked = []
    for seg_id in failed:
        try:
            file_id = int(control.segment(seg_id).file_id or 0)
        except KeyError:
            continue  # already cut off or reclaimed
        if control.mark_damaged(seg_id, file_id in bad_headers):
            marked.append(seg_id)
            logger.warning("segment %d failed its checksum; its session is cut before it",
                           seg_id)
    return Finished(loaded, failed, tuple(marked))


def settle(control: ControlPlane) -> list[ReclaimAction]:
    """What the host applies now: cuts at damage nothing in flight blocks (drops with
    quarantine where the file header is damaged), then queued reclaim actions."""
    return control.settle_damage()


@dataclass(frozen=True, slots=True)
class StoreBegun:
    """What ``begin_store`` did, for the host to apply in order.

    Attributes:
        settled: ``settle``'s actions (applied first).
        cut_pending: the session is being cut before a damaged segment: nothing was
            prepared; the host waits for what still uses the cut-off part and begins
            again.
        plan: the store's plan; None when every new block is already being written.
        reclaimed: the reclaim actions that made room for it (applied next).
    """

    settled: tuple[ReclaimAction, ...]
    cut_pending: bool
    plan: StorePlan | None = None
    reclaimed: tuple[ReclaimAction, ...] = ()


def begin_store(control: ControlPlane, session_id: str, keys: Sequence[bytes], *,
                turn_index: int, context_tokens: int, prev_reply_tokens: int | None = None,
                shared_refcount: int = 1) -> StoreBegun:
    """Settle, then prepare the store of ``keys`` (``ControlPlane.prepare_store``)
    unless the session is being cut (module docstring)."""
    settled = tuple(settle(control))
    if control.cut_pending(session_id):
        return StoreBegun(settled, True)
    plan = control.prepare_store(session_id, keys, turn_index=turn_index,
                                 context_tokens=context_tokens,
                                 prev_reply_tokens=prev_reply_tokens,
                                 shared_refcount=shared_refcount)
    return StoreBegun(settled, False, plan, tuple(control.take_reclaim_actions()))


@dataclass(frozen=True, slots=True)
class StoreEnded:
    """What ``end_store`` did, for the host to apply.

    Attributes:
        releases: window rows the books released (the host punches them out of their
            files before it lets go of the books).
        file_end_bytes: a failed SSD store: the books' append pointer of its file (the
            host shrinks the file back to it); None when the books released the file
            (the host deletes it), or the store did not fail on SSD.
    """

    releases: tuple[WindowRelease, ...] = ()
    file_end_bytes: int | None = None


def end_store(control: ControlPlane, plan: StorePlan, ok: bool,
              copied: bool = False) -> StoreEnded:
    """The data plane finished writing ``plan``: its memory copy is told first when
    ``copied`` (written, not yet told: ``complete_copy``), then the store completes
    (published only when ``ok``, its bytes durable; else its allocation given back), and
    the window rows a durable store released are taken (module docstring)."""
    if copied:
        control.complete_copy(plan)
    control.complete_store(plan, ok)
    if ok:
        return StoreEnded(tuple(control.take_window_releases()))
    if plan.medium != Medium.SSD:
        return StoreEnded()
    file_id = int(plan.file_id or 0)
    kept = file_id in control.files_of(plan.session_id)
    return StoreEnded((), control.file_end_bytes(file_id) if kept else None)


# -- the verbs as executor tasks ---------------------------------------------------


def reads_ssd(hit: PrefixHit, first_block: int = 0) -> bool:
    """Whether a restore of ``hit`` into an engine holding blocks ``[0, first_block)``
    reads SSD (an async load); the same rule ``load_task`` plans by."""
    return any(r.segment.medium == Medium.SSD and r.prefix_start + r[2] > first_block
               for r in hit.runs)


def load_task(control: ControlPlane, request_id: Hashable, hit: PrefixHit,
              block_ids: Sequence[int], first_block: int = 0) -> tuple[LoadTask, LoadPlan]:
    """Pin ``hit`` for a restore (``prepare_load``) and describe it for the executor:
    request blocks ``[first_block, hit.num_blocks)`` into slots ``block_ids``."""
    if len(block_ids) < hit.num_blocks:
        raise ValueError(f"request {request_id!r}: {len(block_ids)} block ids for "
                         f"{hit.num_blocks} hit blocks")
    # Where each hit run starts in the request (a refill copies its segment from there).
    start_of = {run.segment.segment_id: run.prefix_start for run in hit.runs}
    read = hit
    if first_block > 0:
        # The engine holds blocks [0, first_block): only the runs past them are read (an
        # SSD segment crossing first_block is read from first_block on when it has block
        # crcs, else whole, for its layer crc32).
        runs = trim_hit(hit, first_block)
        ssd = sum(r[2] for r in runs if r.segment.medium == Medium.SSD)
        read = PrefixHit(hit.num_blocks, hit.num_blocks - first_block - ssd, ssd, runs)
    planner = StreamPlanner({})
    plan = control.prepare_load(request_id, read, planner=planner, refill=True)
    stream_request = tuple(r if r >= first_block else -1 for r in planner.stream_request
                           ) if first_block else tuple(planner.stream_request)
    where = {run.segment.segment_id: (int(run.segment.file_id or 0),
                                      int(run.segment.file_offset or 0))
             for run in read.runs if run.segment.medium == Medium.SSD}
    check_files = tuple((c.tag, *where[c.tag]) for c in planner.checks)
    # One entry per piece of each copy (a copy may span several arena extents).
    refills = tuple((home.segment_id, start_of[home.segment_id] + start, piece.num_blocks,
                     int(piece.offset), piece.total_bytes)
                    for home, copy in plan.refills for piece, start in copy.starts())
    task = LoadTask(str(request_id), plan.read_plan, stream_request, tuple(planner.checks),
                    check_files, tuple(map(int, block_ids[:hit.num_blocks])),
                    hit.num_blocks, first_block, sync=not reads_ssd(hit, first_block),
                    refills=refills)
    return task, plan


def store_task(request_id: str, plan: StorePlan, block_ids: Sequence[int]) -> StoreTask:
    """The write of ``plan``'s segment from the request's slots ``block_ids`` (one per
    request block; the segment's are taken from ``plan.first_block`` on)."""
    first = plan.first_block
    return StoreTask(request_id, plan, tuple(
        map(int, block_ids[first:first + plan.segment.num_blocks])))


# Who deletes and cuts the files the books dropped and punches the window rows they
# released, where it is not the caller's data plane (a node service's own): (drops,
# cuts, releases).
FileWork = Callable[[Sequence[FileDrop], Sequence[FileCut], Sequence[WindowRelease]], None]


def reclaim_tasks(actions: Iterable[ReclaimAction]) -> tuple[list[FileCut], list[FileDrop]]:
    """The disk side of the books' actions: files to cut, files to delete."""
    cuts: list[FileCut] = []
    drops: list[FileDrop] = []
    for action in actions:
        cuts.extend(action.cut_files)
        drops.extend(FileDrop(f, action.quarantine) for f in action.file_ids)
    return cuts, drops


def ssd_held_bytes(hit: PrefixHit, end: int) -> int:
    """SSD bytes the layers hold of request blocks ``[0, end)`` of ``hit`` (every layer
    of every block, but a sliding window's rows only)."""
    total = 0
    for seg, start, count, prefix_start in hit.runs:
        n = min(count, end - prefix_start)
        if n > 0 and seg.medium != Medium.MEMORY:
            total += seg.layout.held_bytes(start, n)
    return total


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
