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

Pure: the books and the plans only, no I/O; single-threaded like the books (the host
serialises calls).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from flatcake.control.index import EMPTY_HIT, PrefixHit
from flatcake.control.plane import ControlPlane
from flatcake.control.queues import RestoreRequest
from flatcake.control.types import LoadPlan, ReclaimAction
from flatcake.plan.remote import RemoteRun, trim_runs
from flatcake.plan.serve import load_task
from flatcake.plan.tasks import LoadDone, LoadTask

logger = logging.getLogger(__name__)

__all__ = ["Finished", "Servable", "finish_load", "load", "remote_blocks",
           "restore_request", "servable", "settle"]


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
