"""The executor's loads (``cio.executor.Executor`` is built on them): a ``LoadTask``
with the executor's crcs filled in becomes a restore job, run on a restore thread with
one of the staging windows (an SSD restore, async or in the step) or on the sync thread
(all-memory), then its remote runs (``cio.remote_load``) and its ``LoadOutcome``.

A load the caller may give up on carries a ``Fence`` (``cio.restore``): once closed,
nothing more of it is written into the caller's paged KV, and it ends as a miss.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.crc import SegmentCrcs
from flatcake.cio.dispatch import ReaderDispatch
from flatcake.cio.files import SessionFiles
from flatcake.cio.filescan import segment_at
from flatcake.cio.format import FormatError
from flatcake.cio.paged import PagedKV
from flatcake.cio.refill import LayerRefills
from flatcake.cio.remote_load import remote_part
from flatcake.cio.restore import (
    Fence,
    LayerReady,
    LoadAbandoned,
    OpenFile,
    RestoreJob,
    RestoreOutcome,
)
from flatcake.cio.staging import StagingWindow
from flatcake.geometry import KVGeometry
from flatcake.plan.stream import StreamCheck
from flatcake.plan.tasks import LoadDone, LoadTask

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """A finished load: the report for the books and what the window measured."""

    done: LoadDone
    restore: RestoreOutcome


def _into(result: Future[LoadOutcome], fn: Callable[..., LoadOutcome], *args: object
          ) -> None:
    """``fn(*args)``'s outcome or exception into ``result``."""
    try:
        result.set_result(fn(*args))
    except BaseException as exc:
        result.set_exception(exc)


class InFlight:
    """Loads in flight on the executor's pools (futures submitted and not yet settled),
    so that closing waits for them within a deadline instead of without one
    (``Executor.close``). A load counts from its submission until its last future
    settles: its result, its exception, or its cancellation (a pool shut down before it
    started)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def track(self, fut: Future[Any]) -> Future[Any]:
        """Count ``fut`` until it settles; returns it."""
        with self._cond:
            self._count += 1
        fut.add_done_callback(self._settled)
        return fut

    def _settled(self, _fut: Future[Any]) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every tracked future; returns how many are
        still unsettled (0: all settled)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.wait_for(lambda: self._count == 0,
                                max(deadline - time.monotonic(), 0.0))
            return self._count


class ExecutorLoads:
    """The loads of ``Executor`` (which sets every attribute)."""

    geometry: KVGeometry
    attached: bool
    lock: threading.Lock
    files: SessionFiles
    crcs: dict[tuple[int, int], SegmentCrcs]
    readers: ReaderDispatch
    arena: ArenaBuffer
    _windows: queue.Queue[StagingWindow]
    _sync_window: StagingWindow
    _restores: ThreadPoolExecutor
    _sync_pool: ThreadPoolExecutor
    _remote_pool: ThreadPoolExecutor
    _in_flight: InFlight

    def load_job(self, task: LoadTask, paged: PagedKV) -> tuple[RestoreJob, tuple[int, ...]]:
        """The restore job of ``task``, with this executor's crcs filled in. Segments it
        cannot verify (no crcs, or their file is gone) cut the load before them."""
        cut = task.num_blocks
        cut_tags: list[int] = []
        checks: list[StreamCheck] = []
        files: dict[int, OpenFile] = {}
        with self.lock:
            where = {tag: (fid, off) for tag, fid, off in task.check_files}
            for check in task.checks:
                fid, off = where[check.tag]
                book = self.crcs.get((fid, off))
                if book is None and self.attached:
                    book = self._crcs_on_disk(fid, off)
                crcs = None if book is None else book.layers if check.whole else book.over(
                    check, self.geometry.layer_block_bytes)
                if crcs is None or fid not in self.files:
                    cut = min(cut, check.request_start)
                    cut_tags.append(check.tag)
                    crcs = (0,) * self.geometry.num_layers
                checks.append(dataclasses.replace(check, layer_crcs=crcs))
            # Each file once (a history's L layers x T turns of reads name a few files).
            for fid in {op.file_id for lp in task.read_plan.layers for op in lp.ssd_ops}:
                if fid in self.files or (self.attached and self.files.attach(fid)):
                    files[fid] = self.files.open_file(fid)
                else:
                    cut = task.first_block  # a file of the plan is gone: load nothing
        req = torch.tensor(task.stream_request, dtype=torch.int64)
        slots = torch.full_like(req, -1)
        wanted = req >= 0
        slots[wanted] = torch.tensor(task.block_ids, dtype=torch.int64)[req[wanted]]
        job = RestoreJob(task.read_plan, paged, slots.to(paged.device),
                         list(task.stream_request), tuple(checks), files, self.arena.tensor,
                         cut)
        return job, tuple(cut_tags)

    def _crcs_on_disk(self, file_id: int, file_offset: int) -> SegmentCrcs | None:
        """Attached: the crcs a segment another process wrote carries in its
        header (read once, then kept); None when the file or header is unreadable.
        Call under ``self.lock``."""
        if not self.files.attach(file_id):
            return None
        try:
            header = segment_at(self.files.open_file(file_id).path, file_offset)
        except (OSError, FormatError) as exc:
            logger.warning("segment at %d of session file %d: %s", file_offset, file_id, exc)
            return None
        if header.file_id != file_id or header.num_layers != self.geometry.num_layers:
            return None
        self.crcs[(file_id, file_offset)] = header.crcs
        return header.crcs

    def submit_load(self, task: LoadTask, paged: PagedKV, ready: LayerReady,
                    on_done: Callable[[LoadOutcome], None] | None = None,
                    fence: Fence | None = None) -> Future[LoadOutcome]:
        """Start ``task``: an SSD restore on a restore thread (it waits for a free
        staging window), an all-memory one on the sync thread; its remote runs, if any,
        then go on on a remote thread (``store.remote_windows`` of them), so remote
        reads run side by side and neither other pool waits on another node.
        ``on_done`` runs on the last of these threads once every layer is settled.
        ``fence``: closed by a caller that stops waiting (``cio.restore.Fence``); the
        restore then writes nothing more into ``paged`` and ends as a miss."""
        job, cut_tags = self.load_job(task, paged)
        job.fence = fence
        refills = LayerRefills(task, paged, self.arena, self.geometry.layer_window_blocks) \
            if task.refills else None
        if refills is not None:
            job.after_layer = refills.after_layer
        pool = self._restores if self._reads_ssd(task) else self._sync_pool
        if not task.remote:
            return self._in_flight.track(pool.submit(lambda: self._settle(
                task, job, *self._run_local(task, job, cut_tags, ready), ready, on_done,
                refills)))
        result: Future[LoadOutcome] = self._in_flight.track(Future())

        def then_remote(local: Future[tuple[RestoreOutcome, tuple[int, ...]]]) -> None:
            try:
                self._remote_pool.submit(_into, result, self._settle, task, job,
                                         *local.result(), ready, on_done, refills)
            except BaseException as exc:  # the executor is closing
                ready.fail(exc)
                result.set_exception(exc)

        pool.submit(self._run_local, task, job, cut_tags, ready).add_done_callback(then_remote)
        return result

    @staticmethod
    def _reads_ssd(task: LoadTask) -> bool:
        """An SSD restore (async, or a load in the step reading SSD): a restore thread
        and one of the windows, so several run side by side in submission order;
        otherwise (all-memory) the sync thread."""
        return not task.sync or task.read_plan.bytes_read > 0

    def _run_local(self, task: LoadTask, job: RestoreJob, cut_tags: tuple[int, ...],
                   ready: LayerReady) -> tuple[RestoreOutcome, tuple[int, ...]]:
        """The local prefix of ``task``: (its outcome, the failed segment tags)."""
        pooled = self._reads_ssd(task)
        window = self._windows.get() if pooled else self._sync_window
        local = LayerReady(ready.num_layers) if task.remote else ready
        try:
            if job.num_request_blocks <= task.first_block:
                outcome = RestoreOutcome(job.num_request_blocks, (), 0, 0, 0, 0.0)
            else:
                outcome = window.run(job, local)
        except LoadAbandoned:  # the caller gave up on it (and said so): a miss
            logger.debug("FlatCake load for request %s stopped: given up", task.request_id)
            outcome = RestoreOutcome(task.first_block, (), 0, 0, 0, 0.0)
        except Exception as exc:  # a failed load is a miss, never a crash
            logger.warning("FlatCake load for request %s failed: %s", task.request_id, exc)
            outcome = RestoreOutcome(task.first_block, (), 0, 0, 0, 0.0)
            ready.fail(exc)
        finally:
            if pooled:
                self._windows.put(window)
        for layer in range(ready.num_layers):
            local.set(layer)  # a plan with no reads has no layers to signal
        return outcome, tuple(dict.fromkeys((*cut_tags, *outcome.failed_tags)))

    def _settle(self, task: LoadTask, job: RestoreJob, outcome: RestoreOutcome,
                failed: tuple[int, ...], ready: LayerReady,
                on_done: Callable[[LoadOutcome], None] | None,
                refills: LayerRefills | None) -> LoadOutcome:
        """The remote runs once the local prefix is in (``cio.remote_load``), then the
        task's ``LoadOutcome``."""
        loaded = min(outcome.num_blocks_loaded, job.num_request_blocks)
        if loaded < task.num_blocks and self.geometry.layer_window_blocks:
            # A restore reads the window rows at its hit's end only
            # (``control.windows.restore_view``): cut short (a damaged or unreadable
            # segment), it holds no window where it stops, so it serves nothing; the
            # books cut the session at the damage, and the next lookup finds the shorter
            # hit with its window.
            loaded = task.first_block
        remote_bytes = 0
        if task.remote:
            loaded, remote_bytes = remote_part(task, job.paged, loaded, ready,
                                               self.readers.remote)
        refilled = refills.written(loaded, failed) if refills is not None else ()
        # A failed segment's file header is checked too: the books quarantine a file
        # whose header is damaged instead of cutting it (``control.damage``).
        files = {tag: file_id for tag, file_id, _ in task.check_files if tag in failed}
        bad_headers = tuple(sorted({f for f in files.values() if self.header_damage(f)}))
        done = LoadDone(task.request_id, max(loaded, task.first_block), task.remote_end,
                        failed, outcome.bytes_read, outcome.memory_bytes, outcome.elapsed_s,
                        refilled, remote_bytes, bad_headers,
                        staged=outcome.bytes_read > 0 and not outcome.zero_copy)
        out = LoadOutcome(done, outcome)
        if on_done is not None:
            on_done(out)
        return out

    def header_damage(self, file_id: int) -> str:
        """Why the file's header is damaged ("" when it is not, or the file is gone)."""
        with self.lock:
            return self.files.header_damage(file_id) if file_id in self.files else ""
