"""The executor: the one data plane that runs the books' tasks (``plan.tasks``) with bytes.

``FlatCakeStore`` (books + executor in one process) and the vLLM connector's worker half
(the executor alone, fed ``StepPlan``s) both run their I/O here::

    LoadTask   -> load_job: this executor's crcs filled into the checks, paged KV slots
                  of the stream -> a staging window (or zero-copy reads straight into
                  the slots) -> crc32 -> scatter per layer, LayerReady per layer
                  -> remote runs (blocks other nodes hold after the local prefix):
                  the dispatch's remote readers, crc32 checked, scattered per layer
                  (``cio.remote_load``)
                  -> LoadDone (the verified prefix, the failed segments)
    StoreTask  -> prepare_file (create / grow the session file, take the segment's
                  sequence number) -> write: gather + O_DIRECT write + fdatasync (or
                  a copy into the host arena; a write-back, ``StorePlan.home``:
                  from that home's arena range) -> StoreDone
    FileCut    -> truncate a file after its last good segment
    FileDrop   -> delete (or quarantine) a session file
    restart    -> settle: act on the books' verdicts (``control.restart``) on disk

The loads live in ``cio.loads`` (``ExecutorLoads``, this class's base); the stores,
cuts, drops, restart and lifecycle here.

Reader choice is a dispatch keyed by ``(medium, node)`` (``cio.dispatch``): node 0 is
this machine's SSD reader (O_DIRECT ``preadv``, or GDS when CUDA + kvikio are usable);
a remote reader registers under its node without touching the books.

Threads: SSD restores (async, or a CPU engine's SSD hits loaded in the step) run on
``scheduler.max_restores_in_flight`` threads, one staging window each, in the order
they are submitted (the books' FC-MAS order); all-memory loads on one more thread with
a window of its own, so they never wait behind SSD reads (every window is built by
``_window`` with the store's read settings); the remote runs of a load, after its
local prefix, on ``store.remote_windows`` threads (one per receive window of
``cio.remote_readers``); each of these moves off an engine's compute cores as
``store.thread_cpus`` says (``cio.affinity``). ``self.lock`` guards the session files
and the crc book; callers may hold their own lock around a call, never
the other way round (the executor calls back without it).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flatcake.cio.affinity import ThreadCpus, start_threads
from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.crc import SegmentCrcs
from flatcake.cio.direct import ensure_dir, resolve_io_mode, scrub_page
from flatcake.cio.dispatch import LOCAL_NODE, ReaderDispatch, local_reader
from flatcake.cio.files import SessionFiles
from flatcake.cio.format import FileHeader
from flatcake.cio.loads import ExecutorLoads, InFlight, LoadOutcome
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import GdsReader, Reader
from flatcake.cio.restore import OpenFile
from flatcake.cio.scan import DiskScan
from flatcake.cio.staging import StagingWindow
from flatcake.cio.writer import SegmentWriter, WrittenSegment
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from flatcake.control.plane import ControlPlane
from flatcake.control.recovery import FileFate, Recovery
from flatcake.control.types import FileCut, StorePlan, WindowRelease
from flatcake.geometry import KVGeometry
from flatcake.layout import ALIGN
from flatcake.plan.tasks import StoreDone, StoreTask

__all__ = ["ATTACH_WAIT_S", "CLOSE_WAIT_S", "Executor", "LoadOutcome", "StoreOutcome"]

logger = logging.getLogger(__name__)

# Attached: how long a write into a file waits for the process creating it.
ATTACH_WAIT_S = 10.0
# How long ``close`` waits for loads in flight unless told otherwise.
CLOSE_WAIT_S = 10.0

@dataclass(frozen=True, slots=True)
class StoreOutcome:
    """A finished store: the report for the books, write calls, and the I/O error
    (``""`` when none) that failed it."""

    done: StoreDone
    write_calls: int = 0
    error: str = ""


class Executor(ExecutorLoads):
    """Session files, crc book, host arena, writer, readers and staging windows of one
    store directory (see the module docstring)."""

    def __init__(self, root: Path, geometry: KVGeometry, config: FlatCakeConfig, *,
                 arena_path: Path | None = None) -> None:
        self.root = Path(root)
        self.geometry = geometry
        self.config = config
        # Attached to a node service (``arena_path``: the arena it shares): the service
        # holds the root's lock and recovered it; files other processes created are
        # opened when a task first names them, their segments' crcs read from their
        # headers; a failed write never shrinks a file another process appends to.
        self.attached = arena_path is not None
        ensure_dir(self.root)
        self.io_mode = resolve_io_mode(self.root, config.store.io_mode)
        self.lock = threading.Lock()
        self.files = SessionFiles(self.root, self.io_mode)
        if not self.attached:
            self.files.lock_root()
        # (file_id, file_offset) of an SSD segment -> crc32 of each of its layers.
        self.crcs: dict[tuple[int, int], SegmentCrcs] = {}
        self.readers = ReaderDispatch()
        self._windows: queue.Queue[StagingWindow] = queue.Queue()
        try:
            self.arena = ArenaBuffer(config.store.memory_capacity_bytes, arena_path)
            self.writer = SegmentWriter()
            self._local = local_reader(config, self.io_mode)
            self.readers.register(Medium.SSD, LOCAL_NODE, self._local)
            num = config.scheduler.max_restores_in_flight
            for _ in range(num):
                self._windows.put(self._window())
            self._sync_window = self._window()
        except BaseException:
            self.readers.close()
            self.files.close()
            raise
        # The pools a caller's (an engine's) thread starts move off its bound CPUs; the
        # threads they start in turn (reads, crcs, writes) inherit their CPUs.
        self.thread_cpus = ThreadCpus(config.store.thread_cpus)
        self._restores = self.thread_cpus.pool(num, "flatcake-restore")
        self._sync_pool = self.thread_cpus.pool(1, "flatcake-sync-load")
        self._remote_pool = self.thread_cpus.pool(config.store.remote_windows,
                                                  "flatcake-remote")
        self._in_flight = InFlight()

    def start_threads(self) -> None:
        """Start the SSD restore threads and the all-memory load thread now, each moving
        off the calling thread's CPUs as ``store.thread_cpus`` says, and from one of
        them this machine's reader threads (which inherit its CPUs, as when a first
        restore starts them): a first load then starts and pins none. Call it from the
        thread that submits the loads (an engine's, whose CPUs ``auto`` moves off). The
        remote threads, which only a cluster uses, start with their first remote runs.
        Costs a millisecond or two of CPU and ``read_threads + max_restores_in_flight
        + 1`` idle threads (about 130 KiB resident at the defaults); the staging slots
        are still allocated by the first restore through each window, which knows
        their size."""
        start_threads(self._restores, self.config.scheduler.max_restores_in_flight)
        start_threads(self._sync_pool, 1)
        self._restores.submit(self._local.start_threads).result()

    def _window(self) -> StagingWindow:
        """A staging window with the store's read settings: every restore's, the SSD
        restores' and the loads in the step alike."""
        store = self.config.store
        return StagingWindow(self.reader, crc_threads=store.read_threads,
                             reads_in_flight=store.reads_in_flight)

    @property
    def reader(self) -> Reader:
        """This machine's SSD reader."""
        return self.readers.get(Medium.SSD, LOCAL_NODE)

    def share(self) -> None:
        """The root is written by other processes from now on (a node service's, once
        recovered: the engines' workers create and append to its files): drops and
        cuts act on files this executor did not create, as an attached one's do."""
        self.attached = True

    def settle(self, scan: DiskScan, recovery: Recovery, control: ControlPlane) -> None:
        """Act on the books' restart verdicts: quarantine, delete, or keep a file
        (trimmed, cut after its last good segment) with its segments' crcs, which check
        later loads."""
        segments_of = {f.file_id: f.segments for f in scan.files}
        for verdict in recovery.files:
            path = scan.paths.get(verdict.file_id)
            if path is None:
                continue
            if verdict.fate == FileFate.QUARANTINE:
                dest = self.files.quarantine_path(path, verdict.reason)
                logger.warning("session file %s is %s; moved to %s", path, verdict.reason,
                               dest)
            elif verdict.fate == FileFate.DELETE:
                path.unlink(missing_ok=True)  # nothing servable in it
                if verdict.reason:
                    self.files.journal("delete", path, verdict.reason)
            else:
                scanned = {seg.file_offset: SegmentCrcs(seg.header.layer_crcs,
                                                        seg.header.block_crcs)
                           for seg in segments_of.get(verdict.file_id, ())}
                with self.lock:
                    self.files.adopt(path, scan.headers[verdict.file_id], verdict.end_bytes,
                                     cut=verdict.cut)
                    for seg_id in verdict.segment_ids:
                        offset = int(control.segment(seg_id).file_offset or 0)
                        self.crcs[(verdict.file_id, offset)] = scanned.get(
                            offset, SegmentCrcs(recovery.crcs[seg_id]))

    # -- stores ----------------------------------------------------------------------

    def prepare_file(self, plan: StorePlan) -> tuple[int, OpenFile | None]:
        """SSD: create the file if new, grow it to cover the segment, and give the
        segment's sequence number: its file offset in pages, which increases along the
        file whichever process appends (the books allocate in file order). Returns
        (seq, the open file); (0, None) for memory. Raises ``OSError`` (ENOSPC, EIO,
        or, attached, a file another process did not create in time)."""
        if plan.medium != Medium.SSD:
            return 0, None
        file_id, offset = int(plan.file_id or 0), int(plan.file_offset or 0)
        if self.attached and not plan.new_file:
            # A file another process may still be creating: waited for without the
            # lock, so this process's loads go on meanwhile.
            self.files.wait_for(file_id, ATTACH_WAIT_S)
        with self.lock:
            if plan.new_file:
                self.files.create(FileHeader(
                    plan.session_id, file_id, self.config.store.node_id,
                    int(plan.file_base_offset or 0), int(plan.span_bytes or 0),
                    self.geometry.layer_block_bytes, self.geometry.layer_window_blocks))
            elif self.attached and not self.files.attach(file_id):
                raise FileNotFoundError(f"session file {file_id} was not created by the "
                                        f"store that allocated it within {ATTACH_WAIT_S} s")
            self.files.ensure_allocated(file_id, offset + plan.segment.total_bytes)
            return offset // ALIGN, self.files.open_file(file_id)

    def write(self, task: StoreTask, paged: PagedKV | None, seq: int,
              target: OpenFile | None, on_copy: Callable[[], None] | None = None
              ) -> StoreOutcome:
        """Gather the segment's blocks and write them: into the arena (memory), or
        (SSD) a clean memory copy first when the plan has one (``on_copy`` runs after
        it), then the segment to ``target`` and fdatasync. A write-back
        (``StorePlan.home``) takes its blocks from the home's arena range, not from
        ``paged`` (which may be ``None`` then). An ``OSError`` is a failed store (the
        first 4 KiB of an SSD segment are scrubbed), never a crash."""
        plan, seg = task.plan, task.plan.segment
        write: Callable[..., WrittenSegment]
        try:
            if plan.home is not None:  # a not-yet home written back: from the arena
                home = plan.home
                write = functools.partial(
                    self.writer.write_ssd_from_memory,
                    home=self.arena.view(home.offset, home.total_bytes), layout=home.layout)
            elif paged is None:
                raise ValueError(f"the store of segment {seg.segment_id} needs the paged KV")
            else:
                ids = paged.block_table(task.block_ids, unique=False)
                windows = self.geometry.layer_window_blocks
                if target is None:
                    self.writer.write_memory(self.arena.view(seg.offset, seg.total_bytes),
                                             paged, ids, windows, seg.layout.ends)
                    return StoreOutcome(StoreDone(task.request_id, seg.segment_id, True,
                                                  seg.layout.data_bytes))
                if plan.copy is not None:  # spare memory: a clean copy, readable at once
                    # Piece by piece: each holds a run of the segment's blocks in its
                    # own arena extent (the memory layout of that run).
                    for piece, start in plan.copy.starts():
                        self.writer.write_memory(
                            self.arena.view(piece.offset, piece.total_bytes), paged,
                            ids[start:start + piece.num_blocks], windows, piece.layout.ends)
                    if on_copy is not None:
                        on_copy()
                write = functools.partial(self.writer.write_ssd, paged=paged, ids=ids,
                                          layer_window_blocks=windows,
                                          ends=seg.layout.ends)
            if target is None:
                raise ValueError(f"segment {seg.segment_id} is written back to the SSD, "
                                 f"not to memory")
            file_id, offset = int(seg.file_id or 0), int(seg.file_offset or 0)
            try:
                written = write(fd=target.fd, file_offset=offset, keys=seg.keys,
                                file_id=file_id, seq=seq, turn_index=seg.turn_index,
                                first_block=plan.first_block)
            except BaseException:
                scrub_page(target.fd, offset)
                raise
            with self.lock:
                self.crcs[(file_id, offset)] = written.header.crcs
            return StoreOutcome(StoreDone(task.request_id, seg.segment_id, True,
                                          written.total_bytes), written.write_calls)
        except OSError as exc:  # ENOSPC, EIO: this turn is not stored, nothing breaks
            return StoreOutcome(StoreDone(task.request_id, seg.segment_id, False), 0,
                                str(exc) or type(exc).__name__)

    def run_store(self, task: StoreTask, paged: PagedKV | None) -> StoreOutcome:
        """``prepare_file`` + ``write`` (one writer thread: allocation order holds)."""
        try:
            seq, target = self.prepare_file(task.plan)
        except OSError as exc:
            return StoreOutcome(StoreDone(task.request_id, task.plan.segment.segment_id,
                                          False), 0, str(exc) or type(exc).__name__)
        return self.write(task, paged, seq, target)

    def release(self, file_id: int, end_bytes: int | None) -> None:
        """Give a failed write's space back on disk: shrink the file to the books'
        append pointer ``end_bytes``, or delete it (``None``: the books released it)."""
        with self.lock:
            if file_id not in self.files:
                return
            if end_bytes is not None:
                if not self.attached:  # attached: others may have appended past it
                    self.files.shrink(file_id, end_bytes)
                return
            try:
                self.files.delete(file_id)
            except OSError as exc:
                logger.warning("could not delete session file %d after a failed write: %s",
                               file_id, exc)

    # -- drops and cuts --------------------------------------------------------------

    def drop(self, file_id: int, quarantine: bool = False) -> None:
        """Delete (or quarantine) a session file the books dropped."""
        with self.lock:
            for key in [k for k in self.crcs if k[0] == file_id]:
                del self.crcs[key]
            if self.attached:  # another engine may have created it: act on the file
                self.files.attach(file_id)
            if file_id not in self.files:
                return
            reader = self.reader
            if isinstance(reader, GdsReader):
                reader.forget_file(self.files.open_file(file_id).path)
            if quarantine:
                self.files.quarantine(file_id)
            else:
                self.files.delete(file_id)

    def release_window(self, rel: WindowRelease) -> int:
        """Punch window rows the books released out of their file (shared: one another
        process created is opened first, as for a drop); the bytes given back."""
        with self.lock:
            if self.attached:
                self.files.attach(rel.file_id)
            return self.files.release(rel.file_id, rel.pages)

    def cut(self, cut: FileCut) -> None:
        """Truncate a file after its last good segment (a damaged one and everything
        after it are gone on disk too; the session's next append lands there)."""
        with self.lock:
            for key in [k for k in self.crcs if k[0] == cut.file_id and k[1] >= cut.end_bytes]:
                del self.crcs[key]
            if self.attached:
                self.files.attach(cut.file_id)
            if cut.file_id in self.files:
                try:
                    self.files.truncate(cut.file_id, cut.end_bytes)
                except OSError as exc:  # the books are cut; a restart re-checks the crcs
                    logger.error("could not cut session file %d at %d: %s", cut.file_id,
                                 cut.end_bytes, exc)

    # -- lifecycle -------------------------------------------------------------------

    def close(self, close_files: bool = True, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Wait up to ``timeout_s`` for loads in flight, free the windows and readers,
        stop the segment writer's threads and close the files (``close_files=False``
        leaves both for a write still running). Past the deadline it returns False at
        once: loads not yet started are cancelled (never reported done, so nothing of
        them is served), and a load still running keeps its window, the readers and
        the files (the process is ending) and checks its bytes as ever."""
        left = self._in_flight.wait(timeout_s)
        pools = (self._restores, self._sync_pool, self._remote_pool)
        if left:
            logger.warning("FlatCake closed with %d loads still in flight after %.1f s; "
                           "none of them is reported, their files stay open", left,
                           timeout_s)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
            return False
        for pool in pools:
            pool.shutdown(wait=True)
        while not self._windows.empty():
            self._windows.get_nowait().close()
        self._sync_window.close()
        self.readers.close()
        if close_files:
            self.writer.close()
            with self.lock:
                self.files.close()
        return True
