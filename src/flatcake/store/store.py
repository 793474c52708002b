"""``FlatCakeStore``: the public store, gluing the control plane to the data plane.

The control plane (``control.ControlPlane``) keeps the books and plans; this class
executes its plans with real bytes and reports back::

    store_turn:  prepare_store -> gather + write (+ fdatasync) -> complete_store
    load:        lookup -> prepare_load (reads widened to whole segments) ->
                 staging window: read, verify crc32, scatter per layer -> complete_load
    reclaim:     control.reclaim -> delete the files it names
    damage:      a segment fails its crc32 -> it and the rest of the load are a miss ->
                 control.truncate_session -> cut the file before it, delete later files
    open:        scan session files -> control.recover_segment for each valid segment

Damage while serving: a segment that fails its checksum is never returned as KV. Its
session is cut there once no restore or write in flight touches the cut-off part
(until then lookups stop before it): the damaged segment and the session's later
segments are unpublished, their SSD space given back, the file truncated on disk (so a
restart cannot resurrect them), and later turns append after the last good segment.
The earlier turns stay served. Only a damaged *file header* (checked before the cut)
sends the session's files to ``quarantine/``.

Threads: any thread may call the public methods. ``self._lock`` serialises every call
into the control plane and guards the store's own books (open files, segment
checksums, pending cuts); it is never held across I/O except the small, rare file
cuts. ``self._unpinned`` (on the same lock) is notified whenever a restore or write
ends, which is what a pending cut waits for. Restores run on a pool of
``scheduler.max_restores_in_flight`` threads, one staging window each: a restore that
finds every window busy waits in the pool's queue; it is never cancelled.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.direct import (
    aligned_buffer,
    ensure_dir,
    pwrite_all,
    resolve_io_mode,
    writable_view,
)
from flatcake.cio.files import SessionFiles
from flatcake.cio.format import (
    FileHeader,
)
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader, GdsReader, Reader, kvikio_available
from flatcake.cio.staging import (
    LayerReady,
    OpenFile,
    RestoreJob,
    RestoreOutcome,
    StagingWindow,
)
from flatcake.cio.writer import SegmentWriter
from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.control import ControlPlane, LoadPlan, ReclaimAction, StorePlan
from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit
from flatcake.control.keys import check_key
from flatcake.geometry import KVGeometry, preset
from flatcake.plan.layout import ALIGN
from flatcake.plan.stream import StreamPlanner
from flatcake.store.inspect import FsckReport, fsck_root
from flatcake.store.record import write_record
from flatcake.store.recovery import recover_root
from flatcake.store.results import (
    LoadResult,
    LookupResult,
    ReclaimResult,
    StoreResult,
    TurnSignals,
)

logger = logging.getLogger(__name__)


def build_restore_path(
    config: FlatCakeConfig, io_mode: str
) -> tuple[Reader, queue.Queue[StagingWindow]]:
    """The reader (GDS when CUDA + kvikio are usable on a direct-I/O root, else O_DIRECT
    preadv) and ``scheduler.max_restores_in_flight`` staging windows over it, each
    bounded by ``store.reads_in_flight``. Shared by the store and the vLLM worker."""
    reader: Reader = (GdsReader(config.store.read_threads)
                      if io_mode == "direct" and kvikio_available()
                      else DirectReader(config.store.read_threads))
    windows: queue.Queue[StagingWindow] = queue.Queue()
    for _ in range(config.scheduler.max_restores_in_flight):
        windows.put(StagingWindow(reader, crc_threads=config.store.read_threads,
                                  reads_in_flight=config.store.reads_in_flight))
    return reader, windows


class LoadHandle:
    """A restore in progress (``FlatCakeStore.start_load``).

    ``wait_for_layer(l)`` returns once layer ``l`` of the loaded blocks is in the paged
    KV, so an engine can run layer ``l`` while later layers are still being read;
    ``wait()`` returns the final ``LoadResult``, whose ``num_blocks`` is authoritative
    (a checksum failure in a later layer can still shorten the loaded prefix).
    """

    def __init__(self, num_hit_blocks: int, ready: LayerReady,
                 future: Future[LoadResult]) -> None:
        self.num_hit_blocks = num_hit_blocks
        self._ready = ready
        self._future = future

    @property
    def num_layers(self) -> int:
        return self._ready.num_layers

    def wait_for_layer(self, layer: int, timeout: float | None = None) -> bool:
        return self._ready.wait_for_layer(layer, timeout)

    def wait(self, timeout: float | None = None) -> LoadResult:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


class FlatCakeStore:
    """A FlatCake KV store rooted at a directory. Open it with ``FlatCakeStore.open``."""

    def __init__(self, root: Path, geometry: KVGeometry, config: FlatCakeConfig,
                 clock: Clock, verify_on_open: bool) -> None:
        self.root = root
        self.geometry = geometry
        self.config = config
        ensure_dir(root)
        self.io_mode = resolve_io_mode(root, config.store.io_mode)
        self._files = SessionFiles(root, self.io_mode)
        self._files.lock_root()
        self._lock = threading.Lock()
        self.control = ControlPlane(geometry, config, clock)
        self.arena = ArenaBuffer(config.store.memory_capacity_bytes)
        self._writer = SegmentWriter()
        self.reader, self._windows = build_restore_path(config, self.io_mode)
        num_windows = config.scheduler.max_restores_in_flight
        self._restores = ThreadPoolExecutor(max_workers=num_windows,
                                            thread_name_prefix="flatcake-restore")
        self._crcs: dict[int, tuple[int, ...]] = {}  # SSD segment id -> layer crcs
        # Segments that failed a crc check and are not cut off yet (lookups stop there),
        # and per session the first of them: where its pending cut goes.
        self._damaged_segments: set[int] = set()
        self._cuts: dict[str, int] = {}
        self._unpinned = threading.Condition(self._lock)
        self._request_ids = itertools.count()
        self._closed = False
        try:
            self.recovery = recover_root(self._files, self.control, verify_on_open,
                                         self._crcs)
            write_record(root, geometry, config, self.io_mode)  # for offline `inspect`
        except BaseException:
            self._shutdown()
            raise

    @classmethod
    def open(cls, root: str | os.PathLike[str], geometry: KVGeometry | str,
             config: FlatCakeConfig | None = None, *, clock: Clock | None = None,
             verify_on_open: bool = False) -> FlatCakeStore:
        """Open (or create) the store at ``root`` for blocks of ``geometry`` (a
        ``KVGeometry`` or a preset name).

        Rebuilds the index from the session files found there (restart recovery):
        torn or corrupt segments are skipped, counted in ``store.recovery``, and the
        file is cut before them. ``verify_on_open`` checks every data crc now (slow on
        big stores); otherwise data crcs are checked on every load. ``root`` wins over
        ``config.store.root``.
        """
        if isinstance(geometry, str):
            geometry = preset(geometry)
        if not isinstance(geometry, KVGeometry):
            raise ValueError(f"geometry must be a KVGeometry or a preset name, got "
                             f"{type(geometry).__name__}")
        config = config if config is not None else FlatCakeConfig()
        if not isinstance(config, FlatCakeConfig):
            raise ValueError(f"config must be a FlatCakeConfig, got {type(config).__name__}")
        return cls(Path(root).absolute(), geometry, config,
                   clock if clock is not None else WallClock(), verify_on_open)

    # -- restart ---------------------------------------------------------------------

    # -- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self.root} is closed")

    @staticmethod
    def _check_keys(keys: Sequence[bytes]) -> tuple[bytes, ...]:
        if isinstance(keys, bytes | str) or not isinstance(keys, Sequence):
            raise ValueError(f"keys must be a sequence of 32-byte keys, got "
                             f"{type(keys).__name__}")
        return tuple(check_key(k, f"keys[{i}]") for i, k in enumerate(keys))

    def _paged(self, kv_caches: Sequence[torch.Tensor], block_ids: Any, num_keys: int,
               unique: bool) -> tuple[PagedKV, torch.Tensor]:
        paged = PagedKV(kv_caches, self.geometry.block_bytes_per_layer)
        if paged.num_layers != self.geometry.num_layers:
            raise ValueError(f"kv_caches has {paged.num_layers} layers, geometry "
                             f"{self.geometry.name!r} has {self.geometry.num_layers}")
        table = paged.block_table(block_ids, unique=False)
        if table.numel() < num_keys:
            raise ValueError(f"block_ids has {table.numel()} entries for {num_keys} keys")
        table = table[:num_keys]
        if unique:
            paged.block_table(table.cpu(), unique=True)
        return paged, table

    def _apply_actions(self, actions: Sequence[ReclaimAction],
                       quarantine: bool = False) -> ReclaimResult:
        """Cut, delete (or quarantine) the files the control plane dropped. Called
        under ``self._lock``."""
        deleted = 0
        for action in actions:
            for seg in action.ssd_segments:
                self._crcs.pop(seg.segment_id, None)
                self._damaged_segments.discard(seg.segment_id)
            for cut in action.cut_files:
                self._files.truncate(cut.file_id, cut.end_bytes)
            for file_id in action.file_ids:
                if file_id in self._files and isinstance(self.reader, GdsReader):
                    self.reader.forget_file(self._files.open_file(file_id).path)
                if quarantine:
                    self._files.quarantine(file_id)
                else:
                    self._files.delete(file_id)
                deleted += 1
            if action.session_dropped:
                self._cuts.pop(action.session_id, None)
        return ReclaimResult(tuple(a.session_id for a in actions), deleted,
                             sum(a.memory_bytes for a in actions),
                             sum(len(a.ssd_segments) for a in actions))

    def _settle_damage(self) -> None:
        """Apply every pending cut that nothing in flight blocks (under lock): cut the
        session before its damaged segment, or, when the damaged segment's file header
        is damaged too, drop the session and quarantine its files."""
        for sid, seg_id in list(self._cuts.items()):
            try:
                seg = self.control.index.segment(seg_id)
                blocked = self.control.tail_in_use(sid, seg_id)
            except KeyError:  # the session was dropped or reclaimed meanwhile
                del self._cuts[sid]
                continue
            if blocked:
                continue
            reason = self._files.header_damage(int(seg.file_id or 0))
            if not reason:
                action, quarantine = self.control.truncate_session(sid, seg_id), False
            elif self.control.session(sid).num_pins == 0:
                logger.warning("session %r: file %d has a damaged header (%s); the session "
                               "is dropped", sid, seg.file_id, reason)
                action, quarantine = self.control.drop_session(sid), True
            else:
                continue
            self._cuts.pop(sid, None)
            try:
                self._apply_actions([action], quarantine=quarantine)
            except OSError as exc:
                # The books are already cut; a segment left on disk fails its crc again
                # if a restart brings it back. The caller's own call is not failed.
                logger.error("session %r: could not cut its files on disk: %s", sid, exc)

    # -- store -----------------------------------------------------------------------

    def store_turn(self, session_id: str, keys: Sequence[bytes],
                   kv_caches: Sequence[torch.Tensor], block_ids: Any,
                   signals: TurnSignals) -> StoreResult:
        """Store the blocks of ``keys`` not stored yet, from the paged KV.

        ``keys``: the request's block keys, history first (``control.keys``);
        ``block_ids[i]`` is the paged KV slot of block ``i`` (extra entries, e.g. a
        partial last block, are ignored). The new blocks are placed (memory or SSD, by
        the rule in ``signals``), gathered layer by layer, written, made durable, and
        only then published. Raises ``CapacityError`` when no medium can take them.
        """
        self._check_open()
        if not isinstance(signals, TurnSignals):
            raise ValueError(f"signals must be a TurnSignals, got {type(signals).__name__}")
        keys = self._check_keys(keys)
        paged, table = self._paged(kv_caches, block_ids, len(keys), unique=False)
        t0 = time.perf_counter()
        with self._lock:
            self._settle_damage()
            while session_id in self._cuts:
                # The session is being cut before a damaged segment: append only after
                # the cut, right behind the last good segment (waits for the restores
                # or writes still using the cut-off part).
                self._unpinned.wait()
                self._settle_damage()
            plan = self.control.prepare_store(
                session_id, keys, turn_index=signals.turn_index,
                context_tokens=signals.context_tokens,
                prev_reply_tokens=signals.prev_reply_tokens,
                shared_refcount=signals.shared_refcount)
            self._apply_actions(self.control.take_reclaim_actions())
            if plan is None:
                return StoreResult(session_id, 0, len(keys), None, "", None, 0, 0, 0.0)
            try:
                seq, target = self._prepare_file(plan)
            except OSError as exc:
                self._store_failed(plan)
                return self._failed_result(plan, exc, t0)
            except BaseException:
                self._store_failed(plan)
                raise
        ok = False
        calls = 0
        error: OSError | None = None
        try:
            ids = table[plan.first_block:plan.first_block + plan.segment.num_blocks]
            if target is None:
                dest = self.arena.view(plan.segment.offset, plan.segment.total_bytes)
                self._writer.write_memory(dest, paged, ids)
            else:
                if plan.copy is not None:  # spare memory: a clean copy, readable at once
                    self._writer.write_memory(
                        self.arena.view(plan.copy.offset, plan.copy.total_bytes), paged, ids)
                    with self._lock:
                        self.control.complete_copy(plan)
                try:
                    written = self._writer.write_ssd(
                        target.fd, int(plan.file_offset or 0), paged, ids, plan.segment.keys,
                        file_id=int(plan.file_id or 0), seq=seq,
                        turn_index=plan.segment.turn_index, first_block=plan.first_block)
                except BaseException:
                    self._scrub(target.fd, int(plan.file_offset or 0))
                    raise
                calls = written.write_calls
                with self._lock:
                    self._crcs[plan.segment.segment_id] = written.header.layer_crcs
            ok = True
        except OSError as exc:  # ENOSPC, EIO: this turn is not stored, nothing breaks
            error = exc
        finally:
            with self._lock:
                if ok:
                    self.control.complete_store(plan, True)
                else:
                    self._store_failed(plan)
                self._unpinned.notify_all()
        if error is not None:
            return self._failed_result(plan, error, t0)
        elapsed = time.perf_counter() - t0
        seg = plan.segment
        logger.debug("stored %d blocks of %r on %s (%s)", seg.num_blocks, session_id,
                     plan.medium.name, plan.placement.rule.value)
        return StoreResult(session_id, seg.num_blocks, plan.first_block, plan.medium,
                           plan.placement.rule.value, seg.base_address, seg.total_bytes,
                           calls, elapsed)

    def _store_failed(self, plan: StorePlan) -> None:
        """Give a failed write's allocation back (under ``self._lock``): the books
        forget it, and on disk its file shrinks back to the books' append pointer, or
        goes when the books released it (a new file whose first write failed)."""
        self.control.complete_store(plan, False)
        if plan.medium != Medium.SSD:
            return
        file_id = int(plan.file_id or 0)
        if file_id not in self._files:
            return
        if file_id in self.control.ssd.files_of(plan.session_id):
            self._files.shrink(file_id, self.control.ssd.file(file_id).end_bytes)
            return
        try:
            self._files.delete(file_id)
        except OSError as exc:
            logger.warning("could not delete session file %d after a failed write: %s",
                           file_id, exc)

    @staticmethod
    def _failed_result(plan: StorePlan, exc: OSError, t0: float) -> StoreResult:
        logger.warning("store of %d blocks of session %r failed: %s; they are not stored",
                       plan.segment.num_blocks, plan.session_id, exc)
        return StoreResult(plan.session_id, 0, plan.first_block, None, "", None, 0, 0,
                           time.perf_counter() - t0, error=str(exc) or type(exc).__name__)

    def _prepare_file(self, plan: StorePlan) -> tuple[int, OpenFile | None]:
        """SSD: create the file if new, grow it to cover the segment, and take the
        segment's sequence number (under ``self._lock``, in allocation order). Returns
        (seq, the open file); (0, None) for memory."""
        if plan.medium != Medium.SSD:
            return 0, None
        file_id = int(plan.file_id or 0)
        if plan.new_file:
            self._files.create(FileHeader(
                plan.session_id, file_id, self.config.store.node_id,
                int(plan.file_base_offset or 0), int(plan.span_bytes or 0),
                self.geometry.num_layers, self.geometry.block_bytes_per_layer))
        self._files.ensure_allocated(file_id, int(plan.file_offset or 0)
                                     + plan.segment.total_bytes)
        return self._files.take_seq(file_id), self._files.open_file(file_id)

    @staticmethod
    def _scrub(fd: int, file_offset: int) -> None:
        """After a failed write, zero the segment's first 4 KiB (best effort) so a
        header that did reach the disk cannot pass for a segment on restart. The range
        is still this write's allocation, so nothing else writes there."""
        zeros = aligned_buffer(ALIGN, pin=False).zero_()
        try:
            pwrite_all(fd, writable_view(zeros), file_offset)
            os.fdatasync(fd)
        except OSError as exc:
            logger.warning("could not scrub a failed segment write at %d: %s",
                           file_offset, exc)

    # -- lookup and load ---------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> LookupResult:
        """How long a prefix of ``keys`` is stored, and where."""
        self._check_open()
        keys = self._check_keys(keys)
        with self._lock:
            hit = self._usable_hit(self.control.lookup(keys))
        return LookupResult(hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks)

    def _usable_hit(self, hit: PrefixHit) -> PrefixHit:
        """``hit`` cut before the first segment known to be damaged."""
        if not self._damaged_segments:
            return hit
        runs = []
        for run in hit.runs:
            if run.segment.segment_id in self._damaged_segments:
                break
            runs.append(run)
        if len(runs) == len(hit.runs):
            return hit
        mem = sum(count for seg, _, count, _ in runs if seg.medium == Medium.MEMORY)
        ssd = sum(count for seg, _, count, _ in runs if seg.medium == Medium.SSD)
        return PrefixHit(mem + ssd, mem, ssd, tuple(runs))

    def load(self, keys: Sequence[bytes], kv_caches: Sequence[torch.Tensor],
             block_ids: Any) -> LoadResult:
        """Restore the stored prefix of ``keys`` into the paged KV slots ``block_ids``
        (``block_ids[i]`` receives block ``i``) and wait for it."""
        return self.start_load(keys, kv_caches, block_ids).wait()

    def start_load(self, keys: Sequence[bytes], kv_caches: Sequence[torch.Tensor],
                   block_ids: Any) -> LoadHandle:
        """Start restoring the stored prefix of ``keys``; returns at once."""
        self._check_open()
        keys = self._check_keys(keys)
        paged, table = self._paged(kv_caches, block_ids, len(keys), unique=True)
        planner = StreamPlanner(self._crcs)
        with self._lock:
            self._settle_damage()
            hit = self._usable_hit(self.control.lookup(keys))
            request_id = ("load", next(self._request_ids))
            plan = self.control.prepare_load(request_id, hit, planner=planner)
        request = planner.stream_request
        req = torch.tensor(request, dtype=torch.int64)
        slots = torch.full_like(req, -1)
        wanted = req >= 0
        slots[wanted] = table.cpu()[req[wanted]]
        slots = slots.to(paged.device)
        files = {}
        with self._lock:
            for lp in plan.read_plan.layers:
                for op in lp.ssd_ops:
                    if op.file_id not in files:
                        files[op.file_id] = self._files.open_file(op.file_id)
        job = RestoreJob(plan.read_plan, paged, slots, request, tuple(planner.checks), files,
                         self.arena.tensor, hit.num_blocks)
        ready = LayerReady(self.geometry.num_layers)
        future = self._restores.submit(self._run_restore, job, plan, ready)
        return LoadHandle(hit.num_blocks, ready, future)

    def _run_restore(self, job: RestoreJob, plan: LoadPlan, ready: LayerReady) -> LoadResult:
        window = self._windows.get()
        try:
            outcome = window.run(job, ready)
        except BaseException as exc:
            ready.fail(exc)
            with self._lock:
                self.control.complete_load(plan.request_id)
                self._unpinned.notify_all()
            raise
        finally:
            self._windows.put(window)
        for layer in range(ready.num_layers):
            ready.set(layer)  # a plan with no reads has no layers to signal
        with self._lock:
            self.control.complete_load(plan.request_id)
            for seg_id in outcome.failed_tags:
                self._mark_damaged(seg_id)
            self._settle_damage()
            self._unpinned.notify_all()
        return self._result(plan, outcome)

    def _mark_damaged(self, segment_id: int) -> None:
        """Record a segment that failed its crc; its session's cut goes before the
        earliest damaged segment (under lock)."""
        try:
            seg = self.control.index.segment(segment_id)
        except KeyError:
            return  # already cut off or reclaimed
        self._damaged_segments.add(segment_id)
        sid = seg.session_id
        first = self._cuts.get(sid)
        if first is not None:
            try:
                old = self.control.index.segment(first)
            except KeyError:
                old = None
            if old is not None and (old.file_id or 0, old.file_offset or 0) <= (
                    seg.file_id or 0, seg.file_offset or 0):
                return
        self._cuts[sid] = segment_id

    def _result(self, plan: LoadPlan, outcome: RestoreOutcome) -> LoadResult:
        loaded = outcome.num_blocks_loaded
        mem = ssd = 0
        for seg, _, count, prefix_start in plan.hit.runs:
            n = max(0, min(count, loaded - prefix_start))
            if seg.medium == Medium.MEMORY:
                mem += n
            else:
                ssd += n
        layer_bytes = self.geometry.block_bytes_per_layer * self.geometry.num_layers
        return LoadResult(
            num_blocks=loaded, num_hit_blocks=plan.hit.num_blocks, num_memory_blocks=mem,
            num_ssd_blocks=ssd, commands=outcome.commands,
            memory_copies=plan.read_plan.num_copies, bytes_read=outcome.bytes_read,
            useful_bytes=ssd * layer_bytes, memory_bytes=outcome.memory_bytes,
            damaged_segments=len(outcome.failed_tags), elapsed_s=outcome.elapsed_s,
            read_path="zero-copy" if outcome.zero_copy else "staging",
            staging_reason=outcome.zero_copy_refusal)

    # -- reclaim, reports, lifecycle ---------------------------------------------------

    def reclaim(self) -> ReclaimResult:
        """Drop whole sessions, oldest last access first, from every medium above its
        high watermark until it is under its low watermark; delete their files."""
        self._check_open()
        with self._lock:
            self._settle_damage()
            return self._apply_actions(self.control.reclaim())

    def drop_session(self, session_id: str) -> ReclaimResult:
        """Forget a session now (it ended); refuses one a restore or write is using."""
        self._check_open()
        with self._lock:
            return self._apply_actions([self.control.drop_session(session_id)])

    def inspect(self) -> dict[str, Any]:
        """A JSON-able snapshot: media use and watermarks, sessions, placements."""
        self._check_open()
        with self._lock:
            st = self.control.stats()
            now = self.control.clock.now()
            sessions = []
            for sid in self.control.session_ids():
                rec = self.control.session(sid)
                sessions.append({
                    "session_id": sid,
                    "files": self.control.ssd.files_of(sid),
                    "memory_segments": len(rec.memory_segment_ids),
                    "ssd_segments": len(rec.ssd_segment_ids),
                    "memory_bytes": rec.memory_bytes,
                    "ssd_bytes": rec.ssd_bytes,
                    "idle_s": round(now - rec.last_access, 3),
                    "pinned": rec.num_pins > 0,
                    "damaged": sid in self._cuts,
                })
            reads = self.reader.stats()
        return {
            "root": str(self.root),
            "io_mode": self.io_mode,
            "reader": self.reader.name,
            "geometry": {"name": self.geometry.name, "num_layers": self.geometry.num_layers,
                         "block_bytes_per_layer": self.geometry.block_bytes_per_layer},
            "media": {
                "memory": {"used_bytes": st.memory_used_bytes,
                           "capacity_bytes": st.memory_capacity_bytes,
                           "high": st.memory_high, "low": st.memory_low,
                           "segments": st.num_memory_segments},
                "ssd": {"used_bytes": st.ssd_used_bytes, "capacity_bytes": st.ssd_capacity_bytes,
                        "high": st.ssd_high, "low": st.ssd_low,
                        "segments": st.num_ssd_segments, "files": st.num_files},
            },
            "num_keys": st.num_keys,
            "placements_by_rule": st.placements_by_rule,
            "sessions": sessions,
            "recovery": {
                "num_segments": self.recovery.num_segments,
                "damaged_segments": self.recovery.damaged_segments,
                "damaged_files": self.recovery.damaged_files,
            },
            "reads": {"commands": reads.commands, "bytes": reads.bytes_read},
        }

    def fsck(self) -> FsckReport:
        """Verify every checksum of every file under the root (writes are held off)."""
        self._check_open()
        with self._lock, self._writer.lock:
            return fsck_root(self.root)

    def close(self) -> None:
        """Wait for restores in flight, then close every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        self._restores.shutdown(wait=True)
        while not self._windows.empty():
            self._windows.get_nowait().close()
        self.reader.close()
        with self._lock:
            self._files.close()

    def __enter__(self) -> FlatCakeStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"FlatCakeStore(root={str(self.root)!r}, geometry={self.geometry.name!r}, "
                f"io_mode={self.io_mode!r})")
