"""The store's restores, ordered by FC-MAS (the books' ``MasScheduler``).

A restore goes the same way as in the vLLM connector and the replay::

    submit ──┬─ all hit blocks in memory ─► ready queue ─► pop_ready: run now (sync
             │                                             thread), deliver when done
             └─ any block on SSD ─► SSD-preparing queue ─► next_restores (priority
                1 + wait / kv bytes, <= max_restores_in_flight, one staging window
                each) ─► restore_done ─► ready queue ─► pop_ready: deliver

A restore that finds every window busy waits in the SSD-preparing queue, highest
priority first; nothing is ever cancelled. ``LoadHandle.wait`` returns once the request
left the ready queue with its bytes in the paged KV; its layers are signalled as they
land (``wait_for_layer``), whatever the queue order.

Each restore's phase (queued, started, reported, released) is the request driver's
(``plan.driver``), the same table the vLLM scheduler half drives; this module adds the
lock, the executor and the caller's future.

Every method runs under the store's lock (``cond``); the executor's threads call back
into ``_finished``, which takes it. ``LoadHandle`` is the caller's side of one restore.
A store that closes waits for its restores within a deadline; those left then are
abandoned: each ends as a miss (no block reported loaded), and its late finish is
ignored. Each restore carries a fence (``cio.restore.Fence``), closed when it is
abandoned: once ``abandon`` returns, no copy of it reaches the caller's paged KV (a
staging scatter, a host-arena copy) and it issues no further read; only a zero-copy read
already with the disk still lands where it was sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from flatcake.cio.executor import Executor, LoadOutcome
from flatcake.cio.paged import PagedKV
from flatcake.cio.restore import Fence, LayerReady
from flatcake.control import ControlPlane, LoadPlan
from flatcake.plan.driver import Phase, RequestDriver, Tracked
from flatcake.plan.tasks import LoadTask
from flatcake.store.results import LoadResult

__all__ = ["LoadHandle", "Restores"]


@dataclass(slots=True)
class _Load:
    """The store's side of one restore: where its bytes go and who waits for them."""

    paged: PagedKV
    ready: LayerReady
    future: Future[LoadResult] = field(default_factory=Future)
    fence: Fence = field(default_factory=lambda: Fence(direct_ok=True))
    result: LoadResult | None = None


_Restore = Tracked[_Load]


class Restores:
    """Restores in the FC-MAS queues and in flight (see the module docstring).

    ``finished(outcome, plan)`` runs under the lock once a restore's bytes are settled
    (unpin, damage) and returns its ``LoadResult``."""

    def __init__(self, cond: threading.Condition, control: ControlPlane, executor: Executor,
                 finished: Callable[[LoadOutcome, LoadPlan], LoadResult]) -> None:
        self._cond = cond
        self._control = control
        self._executor = executor
        self._finish = finished
        self._requests: RequestDriver[_Load] = RequestDriver(control)

    def __len__(self) -> int:
        return len(self._requests)

    def submit(self, task: LoadTask, plan: LoadPlan, paged: PagedKV,
               ready: LayerReady) -> Future[LoadResult]:
        """Queue a planned restore (under the lock); its future resolves on delivery."""
        req = self._requests.admit(task.request_id, _Load(paged, ready))
        self._requests.plan(req, task, plan, in_step=False)
        self._pump()
        return req.books.future

    def _pump(self) -> None:
        for req in self._requests.start_restores():
            self._start(req)
        for req in self._requests.pop_ready():
            if req.phase is Phase.STARTED:
                self._start(req)  # all in memory: runs now
            else:
                self._deliver(req)

    def _start(self, req: _Restore) -> None:
        load, rid, task = req.books, req.request_id, req.task
        if task is None:
            raise ValueError(f"restore {rid!r} started before it was planned")
        self._executor.submit_load(task, load.paged, load.ready,
                                   lambda outcome: self._finished(rid, outcome), load.fence)

    def _finished(self, request_id: str, outcome: LoadOutcome) -> None:
        with self._cond:
            req = self._requests.get(request_id)
            if req is None or req.plan is None:  # abandoned when the store closed: a miss
                return
            try:
                req.books.result = self._finish(outcome, req.plan)
                # An SSD restore gives its slot back and waits in the ready queue; one
                # all in memory left it when it started: released now.
                self._requests.reported(req)
                self._pump()
                if req.phase is Phase.RELEASED:
                    self._deliver(req)
            except BaseException as exc:
                self._requests.drop(request_id)
                req.books.future.set_exception(exc)
                if isinstance(exc, ConnectionError):
                    # The node service is gone: the restores queued behind this one
                    # would never be started by its FC-MAS queue; they fail too (misses).
                    for queued in [r for r in self._requests.loading()
                                   if r.phase is Phase.QUEUED]:
                        self._requests.drop(queued.request_id)
                        queued.books.future.set_exception(exc)
                self._cond.notify_all()
                raise

    def _deliver(self, req: _Restore) -> None:
        self._requests.finish(req.request_id)
        result = req.books.result
        if result is None:
            raise ValueError(f"restore {req.request_id!r} delivered before it ran")
        req.books.future.set_result(result)
        self._cond.notify_all()

    def wait_idle(self, timeout_s: float | None = None) -> int:
        """Block (holding the lock between checks) until no restore is queued or runs,
        at most ``timeout_s`` (None: no limit); returns how many are left."""
        with self._cond:
            self._cond.wait_for(lambda: not self._requests, timeout_s)
            return len(self._requests)

    def abandon(self) -> int:
        """End every restore not delivered yet as a miss (the store is closing): its
        ``wait`` returns no blocks, its layer waits fail, and a late finish is ignored.
        Its fence is closed first, outside the lock (a copy running finishes; none
        starts after). Returns how many."""
        with self._cond:
            gone = self._requests.abandon()
        for req in gone:
            req.books.fence.close()
        with self._cond:
            for req in gone:
                load = req.books
                load.ready.fail(RuntimeError("the store closed before this restore ended"))
                if not load.future.done():
                    hit = req.plan.hit.num_blocks if req.plan is not None else 0
                    load.future.set_result(LoadResult.miss(hit))
            self._cond.notify_all()
            return len(gone)


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
