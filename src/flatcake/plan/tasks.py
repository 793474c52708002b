"""What crosses between the connector's two halves each engine step (picklable values).

::

    scheduler side (control plane)                     worker side (data plane)
    ──────────────────────────────                     ────────────────────────
    build_connector_meta ── StepPlan ──────────────►   loads: read + verify + scatter
                             loads / stores /          stores: gather + write + sync
                             drops / cuts /            drops: delete files; cuts:
                             releases                  truncate a file after its last
                                                       good segment; releases: punch
                                                       superseded window rows out
    update_connector_output ◄── WorkerReport ───────   StoreDone / LoadDone per task

A worker reports each task exactly once, in the step its I/O finished; with tensor
parallelism every worker reports and the scheduler side combines them (a store is good
only if every worker wrote it; a load delivered the shortest prefix any worker did).
"""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.control import FileCut, StorePlan
from flatcake.control.types import WindowRelease
from flatcake.plan.remote import RemoteRun
from flatcake.plan.stream import StreamCheck
from flatcake.readplan import ReadPlan


@dataclass(frozen=True, slots=True)
class LoadTask:
    """Restore a request's stored prefix into its paged KV slots.

    Attributes:
        request_id: the engine's request id.
        read_plan: per-layer SSD reads and arena copies (stream layout, ``plan.stream``).
        stream_request: request block index of each stream block, -1 for a block read
            only so its segment's crc32 can be checked (or already computed locally).
        checks: crc32 checks of the SSD segments read, *without* their crcs: each
            worker fills them in from its own files' segment headers.
        check_files: ``(segment_id, file_id, file_offset)`` of each check's segment.
        block_ids: paged KV slot of each request block ``[0, num_blocks)``.
        num_blocks: request blocks the hit covers.
        first_block: blocks before it are already computed and are not loaded.
        sync: all-memory hit, loaded in this step before the forward pass; otherwise
            an SSD restore the request waits for (``WAITING_FOR_REMOTE_KVS``).
        refills: memory copies to write from the restored blocks once they are
            verified (``placement.copy_on_restore``): ``(home segment id, first request
            block, blocks, arena offset, bytes)`` per arena extent of a copy (a copy
            split over several extents has one entry per piece, all with its home id).
        remote: blocks other nodes hold right after the local hit (request blocks
            ``[num_blocks, remote_end)``), read by the remote readers of the executor's
            ``(medium, node)`` dispatch once the local part is in place.
    """

    request_id: str
    read_plan: ReadPlan
    stream_request: tuple[int, ...]
    checks: tuple[StreamCheck, ...]
    check_files: tuple[tuple[int, int, int], ...]
    block_ids: tuple[int, ...]
    num_blocks: int
    first_block: int
    sync: bool
    refills: tuple[tuple[int, int, int, int, int], ...] = ()
    remote: tuple[RemoteRun, ...] = ()

    @property
    def remote_end(self) -> int:
        """Request blocks the task loads up to, remote ones included."""
        return self.remote[-1].end if self.remote else self.num_blocks

    def __post_init__(self) -> None:
        if len(self.block_ids) < self.num_blocks:
            raise ValueError(f"LoadTask {self.request_id!r}: {len(self.block_ids)} block_ids "
                             f"for num_blocks={self.num_blocks}")
        if not 0 <= self.first_block <= self.num_blocks:
            raise ValueError(f"LoadTask {self.request_id!r}: first_block={self.first_block} "
                             f"outside [0, {self.num_blocks}]")
        at = self.num_blocks
        for run in self.remote:
            if run.request_start != at:
                raise ValueError(f"LoadTask {self.request_id!r}: a remote run starts at "
                                 f"block {run.request_start}, expected {at}")
            at = run.end
        if len(self.block_ids) < at:
            raise ValueError(f"LoadTask {self.request_id!r}: {len(self.block_ids)} block_ids "
                             f"for {at} blocks with the remote ones")


@dataclass(frozen=True, slots=True)
class StoreTask:
    """Write one turn's new blocks as the segment the control plane allocated.

    Attributes:
        request_id: the request whose prompt blocks are written (its blocks stay
            allocated until every worker reports the write).
        plan: the allocation (segment, address, medium, file) from ``prepare_store``.
        block_ids: paged KV slot of each block of the segment, in segment order.
    """

    request_id: str
    plan: StorePlan
    block_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.block_ids) != self.plan.segment.num_blocks:
            raise ValueError(f"StoreTask {self.request_id!r}: {len(self.block_ids)} block_ids "
                             f"for a segment of {self.plan.segment.num_blocks} blocks")


@dataclass(frozen=True, slots=True)
class FileDrop:
    """A session file the control plane dropped (reclaim, or a session cut before a
    damaged segment): delete it, or move it into ``quarantine/`` when ``quarantine``
    (its header is damaged: kept for a post-mortem, never served)."""

    file_id: int
    quarantine: bool = False


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Everything the worker side does in one engine step.

    ``preempted``: requests the engine preempted (their blocks may be reused in this
    step): the worker finishes their stores before the step touches the paged KV.
    ``unpublish``: ``(segment id, keys)`` of the segments the books dropped, when the
    worker serves a cluster: it removes their cluster index entries. ``releases``:
    window rows newer turns superseded that no restore in flight reads
    (``ControlPlane.take_window_releases``): each writing worker punches them out of its
    part's file before it starts this step's loads."""

    loads: tuple[LoadTask, ...] = ()
    stores: tuple[StoreTask, ...] = ()
    drops: tuple[FileDrop, ...] = ()
    cuts: tuple[FileCut, ...] = ()
    preempted: tuple[str, ...] = ()
    unpublish: tuple[tuple[int, tuple[bytes, ...]], ...] = ()
    failed_loads: tuple[FailedLoad, ...] = ()
    releases: tuple[WindowRelease, ...] = ()

    def is_empty(self) -> bool:
        return not (self.loads or self.stores or self.drops or self.cuts or self.preempted
                    or self.unpublish or self.failed_loads or self.releases)


@dataclass(frozen=True, slots=True)
class FailedLoad:
    """A hit the engine admitted whose load could not be planned (the node service went
    away in between): the worker reports its blocks as load errors (the engine
    recomputes them) and, when the engine waits for it (``is_async``), the request as
    received."""

    request_id: str
    block_ids: tuple[int, ...]
    is_async: bool


@dataclass(frozen=True, slots=True)
class StoreDone:
    """A store task finished on one worker.

    Attributes:
        request_id, segment_id: the task.
        ok: the bytes are durable (SSD: written and fdatasync'ed).
        bytes_written: bytes written (SSD) or copied into the arena (memory).
        part, crcs: the tensor-parallel part the worker wrote and the crc32 of each of
            its layers, when a node service publishes it in a cluster (() otherwise).
    """

    request_id: str
    segment_id: int
    ok: bool
    bytes_written: int = 0
    part: int = 0
    crcs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadDone:
    """A load task finished on one worker.

    Attributes:
        request_id: the task.
        num_blocks_loaded: request blocks ``[0, num_blocks_loaded)`` are in the paged KV
            (verified); the rest of the hit must be recomputed.
        num_blocks: request blocks the task meant to load up to.
        failed_segments: segment ids whose bytes failed their crc32 or could not be read.
        bytes_read: SSD bytes read; memory_bytes: bytes copied out of the arena.
        elapsed_s: wall time of the restore.
        refilled: home segment ids of the task's refills whose memory copies were
            written from verified bytes.
        remote_bytes: bytes the remote readers moved from other nodes.
        damaged_headers: files among those of ``failed_segments`` whose file header is
            damaged too (their session is dropped and the files quarantined).
        staged: SSD reads went through the staging window and one copy, not straight
            into the KV slots (``cio.zerocopy``: a block not a multiple of 4 KiB, ...).
        late: a load in the step the engine stopped waiting for at its deadline: none
            of its blocks is delivered (the restore, fenced off, may still be reading).
    """

    request_id: str
    num_blocks_loaded: int
    num_blocks: int
    failed_segments: tuple[int, ...] = ()
    bytes_read: int = 0
    memory_bytes: int = 0
    elapsed_s: float = 0.0
    refilled: tuple[int, ...] = ()
    remote_bytes: int = 0
    damaged_headers: tuple[int, ...] = ()
    staged: bool = False
    late: bool = False


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """Task completions of one step (one worker, or several combined).

    ``late_ended``: loads reported ``LoadDone.late`` whose reads have since ended, one
    entry per worker that gave the load up (the scheduler half plans no SSD load in the
    step while a worker's given-up read still hangs on the disk)."""

    stores: tuple[StoreDone, ...] = ()
    loads: tuple[LoadDone, ...] = ()
    late_ended: tuple[str, ...] = ()

    def merged(self, other: WorkerReport) -> WorkerReport:
        return WorkerReport(self.stores + other.stores, self.loads + other.loads,
                            self.late_ended + other.late_ended)

    def is_empty(self) -> bool:
        return not (self.stores or self.loads or self.late_ended)
