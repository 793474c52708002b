"""The worker half's view of the engine's paged KV and its task runners
(``connectors.worker_side.WorkerSide`` is built on it): registering the engine's KV
tensors, restoring into several KV cache groups, running a store on the writer thread,
and counting what moved.

A model whose layers take their blocks from several block tables (vLLM's hybrid KV
cache manager) runs each task on a scratch paged KV and moves the bytes to and from the
engine's slots group by group (``connectors.group_slots``); its loads are all async,
and a load that fails is also reported by request (``take_failed_requests``).

A load never hands over unverified bytes as good: a segment whose crc32 fails (or
whose read fails) cuts the loaded prefix at its first block, and every block from the
cut on is reported as a load error, so the engine recomputes it.

Threads: the engine thread calls the public methods. Restore threads and the writer
thread hand their results over through ``self._done`` (under ``self._lock``), which
also guards ``self._writing``; the executor guards its files and crc book itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from flatcake.cio.executor import Executor, LoadOutcome
from flatcake.cio.paged import PagedKV
from flatcake.cio.restore import Fence, LayerReady, LoadAbandoned
from flatcake.connectors.group_slots import EnginePages, GroupedKV, StepSlots
from flatcake.control.address import Medium
from flatcake.geometry import KVGeometry
from flatcake.plan.tasks import LoadDone, LoadTask, StoreDone, StoreTask
from flatcake.store.cluster import StoreCluster, segment_crcs

if TYPE_CHECKING:
    from flatcake.cluster.readers import ClusterReaders

logger = logging.getLogger("flatcake.connectors.worker_side")


@dataclass(frozen=True, slots=True)
class _Finished:
    """A load or store the worker finished (handed from a pool thread to the engine
    thread)."""

    task: LoadTask | StoreTask
    load: LoadDone | None = None
    store: StoreDone | None = None




@dataclass(slots=True)
class _Async:
    """An async load in flight, given up by ``poll`` once ``deadline`` passed
    (``time.monotonic()``) unless ``settled`` (its outcome went to ``poll`` first)."""

    task: LoadTask
    fence: Fence
    deadline: float
    settled: bool = False
    given_up: bool = False


class WorkerIO:
    """The paged KV and task runners of ``WorkerSide`` (which sets every attribute)."""

    geometry: KVGeometry
    executor: Executor
    part: int
    paged: PagedKV | None
    grouped: GroupedKV | None
    cluster: StoreCluster | None
    readers: ClusterReaders | None
    _lock: threading.Lock
    _write_cond: threading.Condition
    _writing: Counter[str]
    _done: list[_Finished]
    _stats: Counter[str]
    _scratch: dict[tuple[str, int], PagedKV]
    _failed_requests: set[str]
    _slots: StepSlots | None
    _loads_in_flight: int
    async_load_timeout_s: float
    _async: list[_Async]
    _late_open: int  # given-up loads still reading
    _late_ended: list[str]  # given-up loads whose reads ended since the last poll

    # -- the engine's KV ---------------------------------------------------------------


    def register(self, kv_caches: Sequence[torch.Tensor],
                 layer_group: tuple[int, ...] | None = None, null_id: int = 0,
                 pages: tuple[EnginePages, ...] = ()) -> None:
        """Learn the paged KV: one tensor per layer, in the layer order of the segments
        (``register_kv_caches``); ``layer_group``: the block table (stored KV cache
        group) of each layer, for an engine of several, whose null block is
        ``null_id``; ``pages``: each layer's engine blocks in one FlatCake block.
        Called from the engine's thread, it also starts the executor's load threads
        (``Executor.start_threads``: off that thread's CPUs), so the first restore
        starts none."""
        paged = PagedKV(kv_caches, tuple(p.page_bytes for p in pages) if pages
                        else self.geometry.layer_block_bytes)
        if paged.num_layers != self.geometry.num_layers:
            raise ValueError(f"the engine registered {paged.num_layers} KV layers, the "
                             f"geometry has {self.geometry.num_layers}")
        self.paged = paged
        if layer_group is not None and (len(set(layer_group)) > 1
                                        or any(p.per_block > 1 for p in pages)):
            self.grouped = GroupedKV(paged, layer_group, null_id,
                                     self.geometry.layer_window_blocks, pages)
        self.executor.start_threads()

    def _paged_kv(self) -> PagedKV:
        if self.paged is None:
            raise ValueError("register_kv_caches was not called before the first step")
        return self.paged

    # -- loads ----------------------------------------------------------------------

    def _track_async(self, task: LoadTask) -> _Async:
        """An async load starting now, with its deadline."""
        self._loads_in_flight += 1
        load = _Async(task, Fence(), time.monotonic() + self.async_load_timeout_s)
        self._async.append(load)
        return load

    def _restored_async(self, load: _Async, outcome: LoadOutcome) -> None:
        """An async load ended (a restore thread): ``poll`` reports it, unless ``poll``
        gave it up already, which it then learns ended (``WorkerReport.late_ended``)."""
        with self._lock:
            if not load.given_up:
                load.settled = True
                self._done.append(_Finished(load.task, load=outcome.done))
                return
        self._late_read_ended(load.task.request_id)

    def _late_read_ended(self, request_id: str) -> None:
        """A given-up load's reads ended (a restore thread): the next ``poll`` says so."""
        with self._lock:
            self._late_open -= 1
            self._late_ended.append(request_id)

    def _expire_async(self) -> None:
        """Give up the async loads past their deadline (a hung disk): their fence
        closed, so nothing more of them reaches the KV slots, each is reported done with
        none of its blocks (``LoadDone.late``): its request is recomputed, not held."""
        now = time.monotonic()
        for load in self._async:
            if load.deadline > now or load.settled:
                continue
            load.fence.close()
            task = load.task
            with self._lock:
                if load.settled:  # it ended while the fence closed: reported as it is
                    continue
                load.given_up = True
                self._late_open += 1
                self._done.append(_Finished(task, load=LoadDone(
                    task.request_id, task.first_block, task.remote_end, late=True)))
            logger.warning("FlatCake load of request %s given up: not read %.1f s after "
                           "it started (async_load_timeout_s); its %d blocks are "
                           "recomputed", task.request_id, self.async_load_timeout_s,
                           task.remote_end - task.first_block)
        with self._lock:
            self._async = [x for x in self._async if not (x.settled or x.given_up)]


    def _start_grouped_load(self, grouped: GroupedKV, task: LoadTask,
                            slots: StepSlots) -> None:
        """Restore ``task`` into a scratch paged KV, then its verified blocks into each
        group's slots (async only: the engine learns a failure by request)."""
        ids = slots.loads.get(task.request_id)
        if task.sync or ids is None:
            raise ValueError(f"load of request {task.request_id!r} on an engine of several "
                             f"KV cache groups: {'sync' if task.sync else 'no group slots'}")
        n = len(task.block_ids)
        scratch = grouped.scratch(n)
        load = self._track_async(task)

        def settle(outcome: LoadOutcome) -> None:
            done = outcome.done
            try:
                with load.fence.open():  # not once ``poll`` gave it up
                    grouped.scatter(scratch, ids, task.first_block,
                                    min(done.num_blocks_loaded, n))
            except LoadAbandoned:
                pass  # reported late already; the scratch copy goes unused
            except Exception as exc:  # nothing of it is served: recomputed
                logger.warning("FlatCake load of request %s not scattered: %s",
                               task.request_id, exc)
                done = replace(done, num_blocks_loaded=task.first_block)
            self._restored_async(load, replace(outcome, done=done))

        self.executor.submit_load(replace(task, block_ids=tuple(range(n))), scratch,
                                  LayerReady(self.geometry.num_layers), settle)

    @staticmethod
    def _failed_block_ids(task: LoadTask, done: LoadDone) -> set[int]:
        """Slots of the blocks the task meant to load (remote ones included) but did
        not deliver."""
        start = max(done.num_blocks_loaded, task.first_block)
        return {task.block_ids[b] for b in range(start, task.remote_end)}

    def _count_load(self, done: LoadDone) -> None:
        with self._lock:
            self._stats["bytes_read_ssd"] += done.bytes_read
            self._stats["bytes_copied_memory"] += done.memory_bytes
            self._stats["bytes_read_remote"] += done.remote_bytes

    def take_failed_requests(self) -> set[str]:
        """Requests whose load failed in part since the last call (recomputed)."""
        out, self._failed_requests = self._failed_requests, set()
        return out

    # -- stores ---------------------------------------------------------------------

    def _snapshot(self, grouped: GroupedKV, store: StoreTask) -> StoreTask | None:
        """``store`` over a scratch copy of its blocks taken now (the engine may free a
        sliding-window block before the writer reaches it); None when it cannot be."""
        ids = None if self._slots is None else self._slots.stores.get(store.request_id)
        n = len(store.block_ids)
        scratch = None if ids is None else grouped.snapshot(ids, n,
                                                            store.plan.segment.layout.ends)
        if scratch is None:
            logger.warning("FlatCake store of segment %d (request %s) skipped: a KV cache "
                           "group no longer holds all of its blocks",
                           store.plan.segment.segment_id, store.request_id)
            return None
        self._scratch[(store.request_id, store.plan.segment.segment_id)] = scratch
        return replace(store, block_ids=tuple(range(n)))

    def wait_for_stores(self, request_ids: Sequence[str]) -> None:
        """Block until every store of ``request_ids`` has finished (their blocks are
        about to be reused)."""
        with self._write_cond:
            self._write_cond.wait_for(lambda: not any(self._writing[r] for r in request_ids))

    def _run_store(self, task: StoreTask) -> None:
        ok, written_bytes, crcs = False, 0, None
        paged = self._scratch.pop((task.request_id, task.plan.segment.segment_id), None)
        try:
            # A write-back (``StorePlan.home``) is written from the arena, not the KV.
            out = self.executor.run_store(task, None if task.plan.home is not None
                                          else paged or self._paged_kv())
            ok, written_bytes = out.done.ok, out.done.bytes_written
            if ok and self.cluster is not None:  # durable: the books publish it too
                seg = task.plan.segment
                self.cluster.publish([(seg, self.cluster.segment_crcs(seg))])
            if ok and self.readers is not None:  # the service publishes it: its crcs
                crcs = segment_crcs(self.executor, task.plan.segment)
            if not ok:
                logger.warning("FlatCake store of segment %d (request %s) failed: %s",
                               task.plan.segment.segment_id, task.request_id, out.error)
        except Exception as exc:  # the books roll the allocation back
            logger.warning("FlatCake store of segment %d (request %s) failed: %s",
                           task.plan.segment.segment_id, task.request_id, exc)
        self._finish_store(task, ok, written_bytes, crcs or ())

    def _finish_store(self, task: StoreTask, ok: bool, written_bytes: int,
                      crcs: tuple[int, ...] = ()) -> None:
        done = StoreDone(task.request_id, task.plan.segment.segment_id, ok, written_bytes,
                         self.part, crcs)
        self._scratch.pop((task.request_id, task.plan.segment.segment_id), None)
        with self._write_cond:
            medium = "memory" if task.plan.medium == Medium.MEMORY else "ssd"
            self._stats[f"bytes_written_{medium}"] += written_bytes
            self._done.append(_Finished(task, store=done))
            self._writing[task.request_id] -= 1
            if self._writing[task.request_id] <= 0:
                del self._writing[task.request_id]
            self._write_cond.notify_all()

    # -- reporting ------------------------------------------------------------------

    def take_stats(self) -> dict[str, int]:
        """Byte counters since the last call."""
        with self._lock:
            out = {k: v for k, v in self._stats.items() if v}
            self._stats.clear()
        return out

