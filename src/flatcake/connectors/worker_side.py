"""The connector's worker half: FlatCake's executor (``cio.executor``) inside an engine
worker.

It runs the ``StepPlan`` the scheduler half sends each step on the same executor as
``FlatCakeStore`` and reports what finished (``WorkerReport``). The executor owns the
bytes (the session files under its store directory, the host arena, the staging
windows); this class adds the engine's step rhythm and a view of its paged KV::

    start_step(plan)   preempted requests: finish their stores first (their blocks
                         may be reused by this step);
                       cuts: truncate a file after its last good segment;
                       drops: delete files (or quarantine them);
                       releases: punch superseded window rows out (the books'
                         word: no restore in flight reads them)
                       SSD loads: one restore thread each (two-layer staging window:
                         read layer l+1 while layer l is verified and scattered),
                         each until ``async_load_timeout_s`` from its start: past
                         it ``poll`` gives it up as a sync load is given up (its
                         fence closed, its blocks load errors, its request done)
                       sync loads (all-memory, or SSD in the step): a restore
                         thread whose layers the forward pass waits for
                         (wait_for_layer), each until the step's deadline
                         (``load_timeout_s`` from the step's start): past it the
                         load is given up, its fence closed (nothing more of it
                         reaches the KV slots) and its blocks are load errors;
                         once its reads end, ``poll`` reports it
                         (``WorkerReport.late_ended``)
    end_step()         joins this step's sync loads (within the same deadline);
                       hands the step's stores (the
                       prompt blocks this forward pass computed, and the not-yet
                       homes memory reclaim writes back from the arena:
                       ``StorePlan.home``) to the writer thread (gather + write +
                       sync) through a bounded queue; a store the queue cannot take
                       is reported failed at once
    poll(finished)     finished stores / SSD loads, block ids that failed to load;
                       a finished request whose stores are all done is released
    close()            drain the writer within ``drain_timeout_s`` (also at
                       interpreter exit); a store that cannot finish is dropped:
                       never indexed here, and its torn segment fails its crc32
                       at the next start, so it is never served

A worker that does not write (``writes=False``: a tensor-parallel rank whose KV is the
same as rank 0's, MLA's latent, attached to a node service) reads like the others and
leaves the files to rank 0: it reports each of its stores at once without writing, and
runs no cuts or drops. The books publish a store once every rank reported it, so what
rank 0 writes is published once durable, and a failed write is rolled back as before.

Registering the paged KV, grouped restores, running stores and counting bytes:
``connectors.worker_io``.

In a cluster (``store.cluster_url``) the worker is the node's member
(``store.cluster.StoreCluster``, as ``FlatCakeStore`` holds it): it joins the index as
``store.node_id``, serves its arena and session files to peers, re-publishes the
segments it kept at start-up, publishes each segment once written and durable, removes
the entries of the segments the books dropped (``StepPlan.unpublish``), and reads the
remote runs of a load through the executor's remote readers (a run it cannot fetch or
verify is a load error like any other). Attached to a node service in a cluster, the
service is the member: the worker reads other nodes' blocks with readers of its own
(``cluster.readers``), its part of each remote segment (``part`` of ``parts``: a rank
of split heads reads its heads' part, every rank of a replicated KV part 0), and each
writing worker reports the crc32s of its part with its store (``StoreDone.crcs``) for
the service to publish.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from flatcake.cio.executor import Executor, LoadOutcome
from flatcake.cio.paged import PagedKV
from flatcake.cio.restore import Fence, LayerReady
from flatcake.cio.scan import recover_files
from flatcake.clock import WallClock
from flatcake.config import EngineConfig, FlatCakeConfig
from flatcake.connectors.group_slots import GroupedKV, StepSlots
from flatcake.connectors.worker_io import WorkerIO, _Async, _Finished
from flatcake.connectors.write_queue import WriteQueue
from flatcake.control.plane import ControlPlane
from flatcake.geometry import KVGeometry
from flatcake.plan.remote import runs_of_part
from flatcake.plan.tasks import LoadDone, LoadTask, StepPlan, StoreDone, StoreTask, WorkerReport
from flatcake.store.cluster import StoreCluster
from flatcake.store.record import write_record

if TYPE_CHECKING:
    from flatcake.cluster.readers import ClusterReaders

logger = logging.getLogger(__name__)
_ENGINE = EngineConfig()  # the defaults of the [engine] keys a worker takes


@dataclass(slots=True)
class _InStep:
    """A load of this step the forward pass waits for, until ``deadline``
    (``time.monotonic()``)."""

    task: LoadTask
    ready: LayerReady
    future: Future[LoadOutcome]
    fence: Fence
    deadline: float
    given_up: bool = False


def _drain_at_exit(ref: weakref.ref[WorkerSide]) -> None:
    worker = ref()
    if worker is not None:
        worker.close()


class WorkerSide(WorkerIO):
    """Data plane of one engine worker (see the module docstring).

    Args:
        max_pending_stores: stores the writer's queue holds; one more is dropped.
        drain_timeout_s: how long ``close`` (and the exit hook) waits for stores.
        writes: False for a rank that only reads (see the module docstring).
        load_timeout_s: how long a step waits for its sync loads, from its start
            (``engine.in_step_load_timeout_s``).
        async_load_timeout_s: how long an async load may take, from its start
            (``engine.async_load_timeout_s``).
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig, store_dir: Path, *,
                 max_pending_stores: int = _ENGINE.max_pending_stores,
                 drain_timeout_s: float = _ENGINE.shutdown_drain_s,
                 arena_path: Path | None = None, writes: bool = True,
                 part: int = 0, parts: int = 1,
                 load_timeout_s: float = _ENGINE.in_step_load_timeout_s,
                 async_load_timeout_s: float = _ENGINE.async_load_timeout_s) -> None:
        if max_pending_stores < 1 or drain_timeout_s < 0 or not load_timeout_s > 0 \
                or not async_load_timeout_s > 0:
            raise ValueError(f"max_pending_stores must be >= 1, drain_timeout_s >= 0, "
                             f"load_timeout_s and async_load_timeout_s > 0, got "
                             f"{max_pending_stores}, {drain_timeout_s}, {load_timeout_s}, "
                             f"{async_load_timeout_s}")
        self.load_timeout_s = load_timeout_s
        self.async_load_timeout_s = async_load_timeout_s
        self.geometry = geometry
        self.config = config
        self.store_dir = Path(store_dir)
        self.writes = writes
        self.part, self.parts = part, parts
        # ``arena_path``: attached to a node service, which recovered the files, holds
        # the root and shares its arena; this worker only runs the tasks.
        self.executor = Executor(self.store_dir, geometry, config, arena_path=arena_path)
        self.io_mode = self.executor.io_mode
        self.reader = self.executor.reader
        self._lock = threading.Lock()
        self._writer_thread = WriteQueue(self._run_store, max_pending_stores,
                                         self.executor.thread_cpus.pin)
        self.drain_timeout_s = drain_timeout_s
        self._writing: Counter[str] = Counter()  # request -> stores not yet finished
        self._write_cond = threading.Condition(self._lock)
        self._finished: set[str] = set()  # finished requests still holding stores
        self._closed = False
        self._done: list[_Finished] = []
        self._sync: list[_InStep] = []
        self._async: list[_Async] = []
        self._sync_errors: set[int] = set()
        self._unplanned: set[str] = set()  # async loads the scheduler could not plan
        self._sync_done: list[LoadDone] = []
        self._late_open = 0  # given-up loads still reading
        self._late_ended: list[str] = []  # given-up loads whose reads ended since poll
        self._stores_left: Counter[str] = Counter()
        self._stores_to_start: list[StoreTask] = []
        self._loads_in_flight = 0
        self._stats: Counter[str] = Counter()
        self.paged: PagedKV | None = None
        self.grouped: GroupedKV | None = None
        self._scratch: dict[tuple[str, int], PagedKV] = {}  # grouped stores' snapshots
        self._failed_requests: set[str] = set()
        self._slots: StepSlots | None = None
        self._started: StepPlan | None = None  # the last plan start_step ran
        self.cluster: StoreCluster | None = None
        self.readers: ClusterReaders | None = None  # attached, in a cluster
        if arena_path is not None and config.store.cluster_url:
            from flatcake.cluster.readers import ClusterReaders

            try:
                self.readers = ClusterReaders(config, part)
            except BaseException:
                self.executor.close()
                raise
            self.executor.readers.remote_source = self.readers.reader
        if arena_path is None:
            scratch = self._adopt_files()
            if config.store.cluster_url:
                try:
                    self.cluster = StoreCluster(self.executor,
                                                self.executor.files.sessions_dir)
                    self.cluster.republish(scratch)
                except BaseException:
                    self.executor.close()
                    raise
            # What this store runs with, for offline tools (``flatcake inspect``).
            write_record(self.store_dir, geometry, config, self.io_mode)
        self._exit_hook = partial(_drain_at_exit, weakref.ref(self))
        atexit.register(self._exit_hook)

    # -- start-up --------------------------------------------------------------------

    def _adopt_files(self) -> ControlPlane:
        """Settle the session files left by an earlier process as the books' restart
        decision says (``cio.scan``, on scratch books of this worker's geometry): the
        scheduler half indexes the same segments, so both halves serve the same ones;
        damaged tails are cut so appends continue after the last valid segment."""
        scratch = ControlPlane(self.geometry, self.config, WallClock(), write_backs=True)
        scan, recovery = recover_files(scratch, self.executor.files.sessions_dir)
        self.executor.settle(scan, recovery, scratch)
        return scratch


    # -- steps -----------------------------------------------------------------------

    def start_step(self, plan: StepPlan, slots: StepSlots | None = None) -> None:
        """Start everything ``plan`` asks for; sync loads are waited for per layer.
        ``slots``: the tasks' blocks in every group, for an engine of several. The same
        plan handed over again (an engine that may start a step's loads before its
        forward pass or after it calls both hooks) starts nothing more."""
        if plan is self._started:
            return
        self._started = plan
        if self.grouped is not None and slots is None:
            slots = StepSlots()
        self._slots = slots
        if plan.preempted:
            self.wait_for_stores(plan.preempted)
        for cut in plan.cuts if self.writes else ():
            self.executor.cut(cut)
        for drop in plan.drops if self.writes else ():
            self.executor.drop(drop.file_id, drop.quarantine)
        for rel in plan.releases if self.writes else ():  # no restore reads them now
            self.executor.files.release(rel.file_id, rel.pages)
        if self.cluster is not None and plan.unpublish:
            self.cluster.service.remove(list(plan.unpublish))
        with self._lock:
            for store in plan.stores:
                if store.plan.home is None:  # a write-back holds no request's blocks
                    self._stores_left[store.request_id] += 1
                self._writing[store.request_id] += 1
        self._stores_to_start.extend(plan.stores)
        for failed in plan.failed_loads:  # admitted, never planned: recomputed
            self._sync_errors.update(failed.block_ids)
            self._failed_requests.add(failed.request_id)
            if failed.is_async:
                self._unplanned.add(failed.request_id)
        deadline = time.monotonic() + self.load_timeout_s
        for task in plan.loads:
            if self.grouped is not None and slots is not None:
                self._start_grouped_load(self.grouped, task, slots)
                continue
            ready = LayerReady(self.geometry.num_layers)
            # What this rank reads; ``task`` (every block it meant to load) reports.
            mine = task if not task.remote else replace(
                task, remote=runs_of_part(task.remote, self.part, self.parts))
            if task.sync:
                fence = Fence()
                fut = self.executor.submit_load(mine, self._paged_kv(), ready, fence=fence)
                self._sync.append(_InStep(task, ready, fut, fence, deadline))
            else:
                load = self._track_async(task)
                self.executor.submit_load(mine, self._paged_kv(), ready,
                                          partial(self._restored_async, load),
                                          fence=load.fence)

    def wait_for_layer(self, layer: int) -> None:
        """Block until layer ``layer`` of this step's sync loads is in the paged KV, or
        until a load's deadline, which gives that load up (``_give_up``). A failed or
        given-up load does not raise here: its blocks are reported at the end of the
        step and recomputed."""
        for load in self._sync:
            if load.given_up:
                continue
            try:
                if not load.ready.wait_for_layer(layer, self._left(load)):
                    self._give_up(load, f"layer {layer}")
            except RuntimeError:
                logger.debug("sync load failed before layer %d", layer)

    @staticmethod
    def _left(load: _InStep) -> float:
        return max(load.deadline - time.monotonic(), 0.0)

    def _give_up(self, load: _InStep, where: str) -> None:
        """Stop waiting for ``load``: close its fence (once this returns, nothing of it
        is written into the KV slots), so its blocks are load errors, recomputed."""
        load.fence.close()
        load.given_up = True
        task = load.task
        with self._lock:
            self._late_open += 1
        load.future.add_done_callback(lambda _f: self._late_read_ended(task.request_id))
        logger.warning("FlatCake load of request %s given up at %s: not in the KV %.1f s "
                       "after its step started (in_step_load_timeout_s); its %d blocks are "
                       "recomputed", task.request_id, where, self.load_timeout_s,
                       task.remote_end - task.first_block)

    def late_reads(self) -> int:
        """Loads given up at their deadline (in the step or async) whose reads have not
        ended yet."""
        with self._lock:
            return self._late_open

    def _join(self, load: _InStep) -> LoadDone:
        """``load``'s report, waited for until its deadline; a given-up load reports
        none of its blocks (``LoadDone.late``)."""
        if not load.given_up:
            try:
                return load.future.result(self._left(load)).done
            except TimeoutError:
                self._give_up(load, "the end of the step")
        task = load.task
        return LoadDone(task.request_id, task.first_block, task.remote_end, late=True)

    def end_step(self) -> None:
        """Join this step's sync loads (their failed blocks go to ``poll``), then hand the
        step's stores to the writer thread: off the forward pass, which they would only
        slow down, and from blocks their finished requests keep until reported."""
        for load in self._sync:
            done = self._join(load)
            self._sync_errors.update(self._failed_block_ids(load.task, done))
            self._sync_done.append(done)
            self._count_load(done)
        self._sync = []
        for store in self._stores_to_start:
            if self.grouped is not None and self.writes and store.plan.home is None:
                snap = self._snapshot(self.grouped, store)
                if snap is None:
                    self._finish_store(store, False, 0)
                    continue
                store = snap
            if not self.writes:  # rank 0 writes the one copy; its report publishes it
                self._finish_store(store, True, 0)
            elif self._closed or not self._writer_thread.submit(store):
                logger.warning("FlatCake writer queue is full; segment %d of request %s "
                               "is not stored", store.plan.segment.segment_id,
                               store.request_id)
                self._finish_store(store, False, 0)
        self._stores_to_start = []


    def poll(self, finished: Iterable[str] = ()
             ) -> tuple[set[str], set[str], set[int], WorkerReport]:
        """``(finished_sending, finished_recving, failed block ids, report)`` since the
        last poll. ``finished``: requests the engine finished since the last poll.
        Sending: finished requests that had stores, now all done (durable or failed);
        recving: SSD loads finished; failed: the slots of blocks that failed to load
        (including this step's sync loads)."""
        self._expire_async()
        with self._lock:
            done, self._done = self._done, []
            late_ended, self._late_ended = tuple(self._late_ended), []
        sending: set[str] = set()
        recving, self._unplanned = self._unplanned, set()
        invalid = self._sync_errors
        self._sync_errors = set()
        stores: list[StoreDone] = []
        loads, self._sync_done = self._sync_done, []
        self._finished.update(r for r in finished if r in self._stores_left)
        for item in done:
            if item.store is not None:
                stores.append(item.store)
                if isinstance(item.task, StoreTask) and item.task.plan.home is None:
                    self._stores_left[item.store.request_id] -= 1
            elif item.load is not None and isinstance(item.task, LoadTask):
                loads.append(item.load)
                self._loads_in_flight -= 1
                recving.add(item.load.request_id)
                failed = self._failed_block_ids(item.task, item.load)
                invalid.update(failed)
                if failed:
                    self._failed_requests.add(item.load.request_id)
                self._count_load(item.load)
        for rid in [r for r in self._finished if self._stores_left[r] <= 0]:
            self._finished.discard(rid)
            del self._stores_left[rid]
            sending.add(rid)
        return sending, recving, invalid, WorkerReport(tuple(stores), tuple(loads),
                                                       late_ended)


    # -- lifecycle ------------------------------------------------------------------

    def pending(self) -> int:
        """Stores and SSD loads started and not yet reported by ``poll``."""
        return sum(self._stores_left.values()) + self._loads_in_flight

    def close(self) -> None:
        """Drain the writer, then the restores in flight, both within
        ``drain_timeout_s`` (``Executor.close``), then close every file. Stores that
        never started are dropped (reported failed, so the books roll them back); if
        one is still running at the deadline the files stay open for it (the process
        is ending) and its segment, torn or not, is checked by its crc32 at the next
        start; restores not started by then are cancelled. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._exit_hook)
        t0 = time.monotonic()
        dropped, stopped = self._writer_thread.drain(self.drain_timeout_s)
        for task in dropped:
            self._finish_store(task, False, 0)
        if dropped or not stopped:
            logger.warning("FlatCake stopped with %d stores not written (drain timeout "
                           "%.1f s)", len(dropped) + (not stopped), self.drain_timeout_s)
        else:
            logger.debug("FlatCake writer drained in %.3f s", time.monotonic() - t0)
        if self.cluster is not None:  # leave the index before the arena goes
            self.cluster.close()
        if self.readers is not None:
            self.readers.close()
        self.executor.close(close_files=stopped, timeout_s=max(
            self.drain_timeout_s - (time.monotonic() - t0), 0.0))
