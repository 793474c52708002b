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
from flatcake.plan.requests import remote_blocks
from flatcake.plan.tasks import LoadTask
from flatcake.store.results import LoadResult

__all__ = ["LoadHandle", "Restores"]


@dataclass(slots=True)
class _Load:
    task: LoadTask
    plan: LoadPlan
    paged: PagedKV
    ready: LayerReady
    future: Future[LoadResult] = field(default_factory=Future)
    fence: Fence = field(default_factory=lambda: Fence(direct_ok=True))
    started: bool = False
    popped: bool = False
    result: LoadResult | None = None


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
        self._loads: dict[str, _Load] = {}

    def __len__(self) -> int:
        return len(self._loads)

    def submit(self, task: LoadTask, plan: LoadPlan, paged: PagedKV,
               ready: LayerReady) -> Future[LoadResult]:
        """Queue a planned restore (under the lock); its future resolves on delivery."""
        load = _Load(task, plan, paged, ready)
        self._loads[task.request_id] = load
        self._control.submit_restore(plan, remote_blocks(task))
        self._pump()
        return load.future

    def _pump(self) -> None:
        for started in self._control.next_restores():
            self._start(self._loads[str(started.request_id)])
        while (ready := self._control.pop_ready_restore()) is not None:
            load = self._loads[str(ready.request_id)]
            load.popped = True
            if load.result is not None:
                self._deliver(load)
            elif not load.started:
                self._start(load)  # all in memory: runs now

    def _start(self, load: _Load) -> None:
        load.started = True
        rid = load.task.request_id
        self._executor.submit_load(load.task, load.paged, load.ready,
                                   lambda outcome: self._finished(rid, outcome), load.fence)

    def _finished(self, request_id: str, outcome: LoadOutcome) -> None:
        with self._cond:
            load = self._loads.get(request_id)
            if load is None:  # abandoned when the store closed: already a miss
                return
            try:
                load.result = self._finish(outcome, load.plan)
                if not load.task.sync:
                    self._control.restore_done(request_id)
                self._pump()
                if load.popped and load.result is not None and not load.future.done():
                    self._deliver(load)
            except BaseException as exc:
                del self._loads[request_id]
                load.future.set_exception(exc)
                if isinstance(exc, ConnectionError):
                    # The node service is gone: the restores queued behind this one
                    # would never be started by its FC-MAS queue; they fail too (misses).
                    for rid in [r for r, q in self._loads.items() if not q.started]:
                        self._loads.pop(rid).future.set_exception(exc)
                self._cond.notify_all()
                raise

    def _deliver(self, load: _Load) -> None:
        del self._loads[load.task.request_id]
        result = load.result
        if result is None:
            raise ValueError(f"restore {load.task.request_id!r} delivered before it ran")
        load.future.set_result(result)
        self._cond.notify_all()

    def wait_idle(self, timeout_s: float | None = None) -> int:
        """Block (holding the lock between checks) until no restore is queued or runs,
        at most ``timeout_s`` (None: no limit); returns how many are left."""
        with self._cond:
            self._cond.wait_for(lambda: not self._loads, timeout_s)
            return len(self._loads)

    def abandon(self) -> int:
        """End every restore not delivered yet as a miss (the store is closing): its
        ``wait`` returns no blocks, its layer waits fail, and a late finish is ignored.
        Its fence is closed first, outside the lock (a copy running finishes; none
        starts after). Returns how many."""
        with self._cond:
            loads, self._loads = self._loads, {}
        for load in loads.values():
            load.fence.close()
        with self._cond:
            for load in loads.values():
                load.ready.fail(RuntimeError("the store closed before this restore ended"))
                if not load.future.done():
                    load.future.set_result(LoadResult.miss(load.plan.hit.num_blocks))
            self._cond.notify_all()
            return len(loads)


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
