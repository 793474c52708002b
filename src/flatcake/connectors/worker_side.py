"""The connector's worker half: FlatCake's data plane inside an engine worker.

It executes the ``StepPlan`` the scheduler half sends each step and reports what
finished (``WorkerReport``). It owns the bytes: the session files under its store
directory, the host arena, the staging windows, and a view of the engine's paged KV::

    start_step(plan)   cuts: truncate a file after its last good segment;
                       drops: delete files
                       SSD loads: one restore thread each (two-layer staging window:
                         read layer l+1 while layer l is verified and scattered)
                       sync (all-memory) loads: a restore thread whose layers the
                         forward pass waits for (wait_for_layer)
    end_step()         joins this step's sync loads; hands the step's stores to the
                       writer thread (gather + write + sync), after the forward pass
    poll()             finished stores / SSD loads, block ids that failed to load

A load never hands over unverified bytes as good: a segment whose crc32 fails (or
whose read fails) cuts the loaded prefix at its first block, and every block from the
cut on is reported as a load error, so the engine recomputes it.

Threads: the engine thread calls the public methods. Restore threads and the writer
thread hand their results over through ``self._done`` (under ``self._lock``), which
also guards the session files and the crc book.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from flatcake.cio.direct import ensure_dir, resolve_io_mode
from flatcake.cio.format import FileHeader, FormatError, scan_session_file
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import GdsReader, Reader
from flatcake.cio.staging import (
    LayerReady,
    OpenFile,
    RestoreJob,
    RestoreOutcome,
    StagingWindow,
    StreamCheck,
)
from flatcake.cio.writer import SegmentWriter
from flatcake.config import FlatCakeConfig
from flatcake.connectors.plans import (
    FileDrop,
    LoadDone,
    LoadTask,
    StepPlan,
    StoreDone,
    StoreTask,
    WorkerReport,
)
from flatcake.control import FileCut
from flatcake.geometry import KVGeometry
from flatcake.gva.address import Medium
from flatcake.store.arena import ArenaBuffer
from flatcake.store.files import SessionFiles, session_files_in
from flatcake.store.store import build_restore_path

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Finished:
    """A load or store the worker finished (handed from a pool thread to the engine
    thread)."""

    task: LoadTask | StoreTask
    load: LoadDone | None = None
    store: StoreDone | None = None


class WorkerSide:
    """Data plane of one engine worker (see the module docstring)."""

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig, store_dir: Path) -> None:
        self.geometry = geometry
        self.config = config
        self.store_dir = Path(store_dir)
        ensure_dir(self.store_dir)
        self.io_mode = resolve_io_mode(self.store_dir, config.store.io_mode)
        self._lock = threading.Lock()
        self._files = SessionFiles(self.store_dir, self.io_mode)
        self._files.lock_root()
        # (file_id, file_offset) of an SSD segment -> crc32 of each of its layers.
        self._crcs: dict[tuple[int, int], tuple[int, ...]] = {}
        self.arena = ArenaBuffer(config.store.memory_capacity_bytes)
        self._writer = SegmentWriter()
        self.reader: Reader
        self.reader, self._windows = build_restore_path(config, self.io_mode)
        num_windows = config.scheduler.max_restores_in_flight
        self._sync_window = StagingWindow(self.reader)
        self._restores = ThreadPoolExecutor(num_windows, thread_name_prefix="flatcake-restore")
        self._sync_pool = ThreadPoolExecutor(1, thread_name_prefix="flatcake-sync-load")
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="flatcake-write")
        self._done: list[_Finished] = []
        self._sync: list[tuple[LoadTask, LayerReady, Future[_Finished]]] = []
        self._sync_errors: set[int] = set()
        self._sync_done: list[LoadDone] = []
        self._stores_left: Counter[str] = Counter()
        self._stores_to_start: list[StoreTask] = []
        self._loads_in_flight = 0
        self._stats: Counter[str] = Counter()
        self.paged: PagedKV | None = None
        self._adopt_files()

    # -- start-up --------------------------------------------------------------------

    def _adopt_files(self) -> None:
        """Open the session files left by an earlier process; cut damaged tails so
        appends continue after the last valid segment (the scheduler half indexes the
        same segments from their headers)."""
        for file_id, path in session_files_in(self._files.sessions_dir):
            try:
                header, ok, bad = scan_session_file(path, verify_data=False)
            except FormatError as exc:
                dest = self._files.quarantine_path(path)
                logger.warning("session file %s has a damaged header (%s); moved to %s",
                               path, exc, dest)
                continue
            if header.file_id != file_id:
                logger.warning("session file %s names file id %d; not served", path,
                               header.file_id)
                continue
            end = ok[-1].end_offset if ok else 4096
            next_seq = ok[-1].header.seq + 1 if ok else 0
            self._files.adopt(path, header, end, next_seq, cut=bool(bad))
            for scanned in ok:
                self._crcs[(file_id, scanned.file_offset)] = scanned.header.layer_crcs

    def register(self, kv_caches: Sequence[torch.Tensor]) -> None:
        """Learn the paged KV: one tensor per layer, in the layer order of the segments
        (``register_kv_caches``)."""
        paged = PagedKV(kv_caches, self.geometry.block_bytes_per_layer)
        if paged.num_layers != self.geometry.num_layers:
            raise ValueError(f"the engine registered {paged.num_layers} KV layers, the "
                             f"geometry has {self.geometry.num_layers}")
        self.paged = paged

    def _paged_kv(self) -> PagedKV:
        if self.paged is None:
            raise ValueError("register_kv_caches was not called before the first step")
        return self.paged

    # -- steps -----------------------------------------------------------------------

    def start_step(self, plan: StepPlan) -> None:
        """Start everything ``plan`` asks for; sync loads are waited for per layer."""
        for cut in plan.cuts:
            self._cut(cut)
        for drop in plan.drops:
            self._drop(drop)
        for store in plan.stores:
            self._stores_left[store.request_id] += 1
        self._stores_to_start.extend(plan.stores)
        for task in plan.loads:
            job, cut_tags = self._job(task)
            ready = LayerReady(self.geometry.num_layers)
            if task.sync:
                fut = self._sync_pool.submit(self._run_load, task, job, cut_tags, ready,
                                             None)
                self._sync.append((task, ready, fut))
            else:
                self._loads_in_flight += 1
                self._restores.submit(self._run_load, task, job, cut_tags, ready,
                                      self._windows)

    def wait_for_layer(self, layer: int) -> None:
        """Block until layer ``layer`` of this step's sync loads is in the paged KV.
        A failed load does not raise here: its blocks are reported at the end of the
        step and recomputed."""
        for _task, ready, _fut in self._sync:
            try:
                ready.wait_for_layer(layer)
            except RuntimeError:
                logger.debug("sync load failed before layer %d", layer)

    def end_step(self) -> None:
        """Join this step's sync loads (their failed blocks go to ``poll``), then hand the
        step's stores to the writer thread: off the forward pass, which they would only
        slow down, and from blocks their finished requests keep until reported."""
        for task, _ready, fut in self._sync:
            done = fut.result()
            if done.load is not None:
                self._sync_errors.update(self._failed_block_ids(task, done.load))
                self._sync_done.append(done.load)
                self._count_load(done.load)
        self._sync = []
        for store in self._stores_to_start:
            self._write_pool.submit(self._run_store, store)
        self._stores_to_start = []

    def poll(self) -> tuple[set[str], set[str], set[int], WorkerReport]:
        """``(finished_sending, finished_recving, failed block ids, report)`` since the
        last poll: requests whose stores are all durable, SSD loads finished, the slots
        of blocks that failed to load (including this step's sync loads)."""
        with self._lock:
            done, self._done = self._done, []
        sending: set[str] = set()
        recving: set[str] = set()
        invalid = self._sync_errors
        self._sync_errors = set()
        stores: list[StoreDone] = []
        loads, self._sync_done = self._sync_done, []
        for item in done:
            if item.store is not None:
                stores.append(item.store)
                rid = item.store.request_id
                self._stores_left[rid] -= 1
                if self._stores_left[rid] <= 0:
                    del self._stores_left[rid]
                    sending.add(rid)
            elif item.load is not None and isinstance(item.task, LoadTask):
                loads.append(item.load)
                self._loads_in_flight -= 1
                recving.add(item.load.request_id)
                invalid.update(self._failed_block_ids(item.task, item.load))
                self._count_load(item.load)
        return sending, recving, invalid, WorkerReport(tuple(stores), tuple(loads))

    # -- loads -----------------------------------------------------------------------

    def _job(self, task: LoadTask) -> tuple[RestoreJob, tuple[int, ...]]:
        """The restore job of ``task``, with this worker's crcs filled in. Segments this
        worker cannot verify (no crcs, or their file is gone) cut the load before them."""
        paged = self._paged_kv()
        cut = task.num_blocks
        cut_tags: list[int] = []
        checks: list[StreamCheck] = []
        files: dict[int, OpenFile] = {}
        with self._lock:
            where = {tag: (fid, off) for tag, fid, off in task.check_files}
            for check in task.checks:
                fid, off = where[check.tag]
                crcs = self._crcs.get((fid, off))
                if crcs is None or fid not in self._files:
                    cut = min(cut, check.request_start)
                    cut_tags.append(check.tag)
                    crcs = (0,) * self.geometry.num_layers
                checks.append(StreamCheck(check.stream_start, check.num_blocks, crcs,
                                          check.request_start, check.tag))
                if fid in self._files:
                    files[fid] = self._files.open_file(fid)
        for lp in task.read_plan.layers:
            if any(op.file_id not in files for op in lp.ssd_ops):
                cut = task.first_block  # a file of the plan is gone: load nothing
                break
        req = torch.tensor(task.stream_request, dtype=torch.int64)
        slots = torch.full_like(req, -1)
        wanted = req >= 0
        table = torch.tensor(task.block_ids, dtype=torch.int64)
        slots[wanted] = table[req[wanted]]
        job = RestoreJob(task.read_plan, paged, slots.to(paged.device),
                         list(task.stream_request), tuple(checks), files, self.arena.tensor,
                         cut)
        return job, tuple(cut_tags)

    def _run_load(self, task: LoadTask, job: RestoreJob, cut_tags: tuple[int, ...],
                  ready: LayerReady, windows: queue.Queue[StagingWindow] | None
                  ) -> _Finished:
        window = self._sync_window if windows is None else windows.get()
        try:
            if job.num_request_blocks <= task.first_block:
                outcome = RestoreOutcome(job.num_request_blocks, (), 0, 0, 0, 0.0)
            else:
                outcome = window.run(job, ready)
        except Exception as exc:  # a failed load is a miss, never a crash
            logger.warning("FlatCake load for request %s failed: %s", task.request_id, exc)
            outcome = RestoreOutcome(task.first_block, (), 0, 0, 0, 0.0)
            ready.fail(exc)
        finally:
            if windows is not None:
                windows.put(window)
        for layer in range(ready.num_layers):
            ready.set(layer)
        failed = tuple(dict.fromkeys((*cut_tags, *outcome.failed_tags)))
        loaded = min(outcome.num_blocks_loaded, job.num_request_blocks)
        done = LoadDone(task.request_id, max(loaded, task.first_block), task.num_blocks,
                        failed, outcome.bytes_read, outcome.memory_bytes, outcome.elapsed_s)
        finished = _Finished(task, load=done)
        if windows is not None:
            with self._lock:
                self._done.append(finished)
        return finished

    @staticmethod
    def _failed_block_ids(task: LoadTask, done: LoadDone) -> set[int]:
        """Slots of the blocks the task meant to load but did not deliver."""
        start = max(done.num_blocks_loaded, task.first_block)
        return {task.block_ids[b] for b in range(start, task.num_blocks)}

    def _count_load(self, done: LoadDone) -> None:
        with self._lock:
            self._stats["bytes_read_ssd"] += done.bytes_read
            self._stats["bytes_copied_memory"] += done.memory_bytes

    # -- stores and drops ------------------------------------------------------------

    def _run_store(self, task: StoreTask) -> None:
        plan = task.plan
        seg = plan.segment
        ok, written_bytes = False, 0
        try:
            paged = self._paged_kv()
            ids = paged.block_table(task.block_ids, unique=False)
            if plan.medium == Medium.MEMORY:
                self._writer.write_memory(self.arena.view(seg.offset, seg.total_bytes),
                                          paged, ids)
                written_bytes = seg.layout.data_bytes
            else:
                if plan.copy is not None:  # spare memory: a clean copy, published with it
                    self._writer.write_memory(
                        self.arena.view(plan.copy.offset, plan.copy.total_bytes), paged, ids)
                file_id, offset = int(seg.file_id or 0), int(seg.file_offset or 0)
                with self._lock:
                    if plan.new_file:
                        self._files.create(FileHeader(
                            plan.session_id, file_id, self.config.store.node_id,
                            int(plan.file_base_offset or 0), int(plan.span_bytes or 0),
                            self.geometry.num_layers, self.geometry.block_bytes_per_layer))
                    self._files.ensure_allocated(file_id, offset + seg.total_bytes)
                    seq = self._files.take_seq(file_id)
                    f = self._files.open_file(file_id)
                written = self._writer.write_ssd(
                    f.fd, offset, paged, ids, seg.keys, file_id=file_id, seq=seq,
                    turn_index=seg.turn_index, first_block=plan.first_block)
                with self._lock:
                    self._crcs[(file_id, offset)] = written.header.layer_crcs
                written_bytes = written.total_bytes
            ok = True
        except Exception as exc:  # the books roll the allocation back
            logger.warning("FlatCake store of segment %d (request %s) failed: %s",
                           seg.segment_id, task.request_id, exc)
        done = StoreDone(task.request_id, seg.segment_id, ok, written_bytes)
        with self._lock:
            medium = "memory" if plan.medium == Medium.MEMORY else "ssd"
            self._stats[f"bytes_written_{medium}"] += written_bytes
            self._done.append(_Finished(task, store=done))

    def _drop(self, drop: FileDrop) -> None:
        with self._lock:
            for key in [k for k in self._crcs if k[0] == drop.file_id]:
                del self._crcs[key]
            if isinstance(self.reader, GdsReader) and drop.file_id in self._files:
                self.reader.forget_file(self._files.open_file(drop.file_id).path)
            self._files.delete(drop.file_id)

    def _cut(self, cut: FileCut) -> None:
        """Truncate a file after its last good segment (a damaged one and everything
        after it are gone on disk too; the next append of the session lands there)."""
        with self._lock:
            for key in [k for k in self._crcs if k[0] == cut.file_id and k[1] >= cut.end_bytes]:
                del self._crcs[key]
            if cut.file_id in self._files:
                try:
                    self._files.truncate(cut.file_id, cut.end_bytes)
                except OSError as exc:  # the books are cut; a restart re-checks the crcs
                    logger.error("could not cut session file %d at %d: %s", cut.file_id,
                                 cut.end_bytes, exc)

    # -- reporting and lifecycle -----------------------------------------------------

    def take_stats(self) -> dict[str, int]:
        """Byte counters since the last call."""
        with self._lock:
            out = {k: v for k, v in self._stats.items() if v}
            self._stats.clear()
        return out

    def pending(self) -> int:
        """Stores and SSD loads started and not yet reported by ``poll``."""
        return sum(self._stores_left.values()) + self._loads_in_flight

    def close(self) -> None:
        """Finish writes and restores in flight, then close every file."""
        self._write_pool.shutdown(wait=True)
        self._restores.shutdown(wait=True)
        self._sync_pool.shutdown(wait=True)
        while not self._windows.empty():
            self._windows.get_nowait().close()
        self._sync_window.close()
        self.reader.close()
        with self._lock:
            self._files.close()
