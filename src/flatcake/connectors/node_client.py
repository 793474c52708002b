"""The vLLM scheduler half attached to the node service (``RemoteSchedulerSide``, the
same methods as ``SchedulerSide``, answered by the service through ``link.client``).

Each vLLM hook is at most one call, and most ride with another:

* a step with nothing to hand out sends nothing: a store or restore in flight ends
  with the workers' report (the update), so only file work another engine left could
  be waiting, and the next step that has something collects it;
* a request's ``new_request`` goes with its lookup (or, when another call comes first,
  just before it); the stores a step plans go with the step;
* an admitted hit's ``after_alloc`` goes with the next lookup or step (vLLM builds the
  step right after it admits; alone before any other call), its sources answered from
  its lookup; a refusal is a load error of the step carrying it;
* ``request_finished`` of a request with no load in flight is answered here (its
  ``kv_transfer_params`` are its lookup's, or those the update ending its load
  answered, plus its store's) and goes with the next call (the next ``update``,
  ``step`` or lookup; alone before any other);
* a request whose lookup found its whole prompt held is left out of the step computing
  it (it would store nothing), unless its load delivered less than its hit.

Round trips per request::

    new (a miss, stored)    lookup, the step computing it, the workers' report
    held (vLLM holds it)    lookup
    hit (loaded, whole)     lookup, the step admitting it, the workers' report of the
                            load
    hit (part of it)        as a whole hit, then the step computing the rest (its store)
    idle step               none (nor a step while stores are written; vLLM's ask
                            for stats after each step: one call a second)

When the service does not answer within ``store.node_timeout_s`` (down, restarting)
the engine keeps serving: lookups miss, stores are skipped, restores already running
finish and are released, hits admitted but never planned are handed to the workers as
load errors (the engine recomputes them); one warning, then the half re-attaches on a
later call, waiting ``engine.node_reattach_s`` first, twice as long after each failed
attempt, at most ``engine.node_reattach_max_s``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flatcake.config import FlatCakeConfig
from flatcake.connectors.node_verbs import ADMISSION, ATTACH, ENGINE
from flatcake.connectors.requests import BlockEvent, RequestView, store_params
from flatcake.control import StorePlan
from flatcake.geometry import KVGeometry
from flatcake.link import verbs, wire
from flatcake.link.client import NodeClient
from flatcake.link.wire import Attached, TensorRanks
from flatcake.plan.driver import Event, Phase, RequestTable, Tracked
from flatcake.plan.tasks import FailedLoad, StepPlan, WorkerReport

logger = logging.getLogger("flatcake.service")

MAX_NEW = 64  # requests entered whose new_request waits for a lookup to go with
_DONE_WITH = frozenset({"num_matched_tokens", "step", "update"})  # carry ``_done``
_ADMITTED_WITH = frozenset({"num_matched_tokens", "step"})  # carry ``_admitted``


@dataclass(slots=True)
class _Mirror:
    """What this half knows of one request whose books the service keeps.

    Attributes:
        params: its ``kv_transfer_params`` as the lookup answered them (None: the books
            hold none yet, or the service forgot this engine).
        matched: (local blocks, async) of a lookup with a hit, until ``after_alloc``.
        blocks: the slots of its admitted hit (a load error if the service forgets it
            before a step plans it, or refuses it).
        is_async: its load is async.
        planned: its load is admitted and has not ended (``request_finished`` asks the
            service).
        sources: the hit's tokens in memory and on SSD as looked up; the admitted
            hit's until asked.
        store: its store, planned.
        held_whole: its lookup found its whole prompt held: the step computing it
            leaves it out (it would store nothing), unless its load then delivers
            less than its hit (those blocks are computed, and may need storing).
    """

    params: dict[str, Any] | None = None
    matched: tuple[int, bool] | None = None
    blocks: tuple[int, ...] = ()
    is_async: bool = False
    planned: bool = False
    sources: tuple[int, int] = (0, 0)
    store: StorePlan | None = None
    held_whole: bool = False


class RemoteSchedulerSide:
    """``SchedulerSide``'s methods, answered by the node service (module docstring):
    a ``connectors.base.SchedulerHalf``."""

    ssd_in_step = False  # an attached engine's loads are async
    # vLLM asks for the stats after every step; the service keeps counting between two
    # asks (counters are increments since the last, gauges are read when asked), so
    # asking at most this often loses no count and costs one call a second, not a step.
    stats_every_s = 1.0

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig, *,
                 ranks: TensorRanks | None = None, name: str = "engine",
                 async_loads: bool = False) -> None:
        self.geometry = geometry
        self.async_loads = async_loads  # as ``SchedulerSide``'s, sent at each attach
        self.config = config
        self.ranks = ranks or TensorRanks()
        self.name = name
        store = config.store
        self.client = NodeClient(store.node, store.node_timeout_s, store.node_socket_group)
        self.engine_id = ""
        self.recovered_segments = 0
        self._next_attach = 0.0
        # Re-attach attempts back off while the service is gone, so a hung service
        # costs the engine's scheduler one timeout per attempt, not per hook.
        self._backoff = config.engine.node_reattach_s
        self._report: WorkerReport | None = None
        self._warned = False
        self._pending_stores = False
        self._stats_due = 0.0  # when ``take_stats`` asks the service again
        # A step with work in flight but nothing to hand out sends nothing; one still
        # goes when the service has not heard from this engine for a quarter of its
        # lease (set at attach), so a long write or restore never outlives the lease.
        self._last_call = 0.0
        self._keepalive_s = config.store.node_lease_s / 4
        self._events: list[BlockEvent] = []
        # The requests the service's driver holds for this engine, mirrored in the same
        # table (``plan.driver``): admitted at the lookup, queued once the service
        # planned the load, started with the step that hands it out, released when the
        # service releases it (a load in the step: with that step).
        self._requests: RequestTable[_Mirror] = RequestTable()
        self._failed: list[FailedLoad] = []
        # Requests that entered since the last call: their ``new_request`` goes with the
        # next lookup, or alone, in order, before any other call (the service's books
        # see every request enter before anything else this engine asks).
        self._new: list[RequestView] = []
        # Requests finished since the last call whose answer was this half's own: the
        # service learns each with the next call (``_done_with``), in order.
        self._done: list[RequestView] = []
        # Hits admitted since the last call (``after_alloc``): planned by the service
        # with the next lookup or step, or alone before any other call, in order.
        self._admitted: list[ADMISSION] = []
        self._attach()

    # -- attachment -----------------------------------------------------------------

    def _attach(self, now: bool = False) -> bool:
        t = time.monotonic()
        if t < self._next_attach and not now:
            return False
        self._next_attach = t + self._backoff
        self._backoff = min(self._backoff * 2, self.config.engine.node_reattach_max_s)
        if not self.client.path.exists():
            self._lost(wire.NodeUnavailable(f"no node service socket at {self.client.path}"))
            return False
        try:
            got: Attached = self.client.call(ATTACH, "", self.name, os.getpid(),
                                             self.geometry, self.ranks, self.config,
                                             self.async_loads)
        except (wire.NodeUnavailable, wire.NodeRefused) as exc:
            self._lost(exc)
            return False
        self.engine_id, self.recovered_segments = got.engine_id, got.recovered_segments
        self._keepalive_s = got.config.store.node_lease_s / 4  # the service's lease
        self._backoff = self.config.engine.node_reattach_s
        if self._warned:
            logger.warning("FlatCake: attached to the node service again as %s",
                           self.engine_id)
        self._warned = False
        return True

    def _lost(self, exc: Exception) -> None:
        """The service is gone (or forgot this engine): what it planned for us is
        void; admitted hits become load errors, running restores release themselves."""
        if not self._warned:
            logger.warning("FlatCake: %s; serving without FlatCake until it is back", exc)
            self._warned = True
        self._pending_stores = False
        self._forgotten()

    def _call(self, method: str, *args: Any) -> Any:
        """A call to this engine's half; raises ``NodeUnavailable`` when detached. An
        engine the service forgot attaches again at once (``NodeClient.call_as``)."""
        if self._new and method != "num_matched_tokens":
            self._send_new()
        if self._done and method not in _DONE_WITH:
            self._send_done()
        if self._admitted and method not in _ADMITTED_WITH:
            self._send_admitted()
        return self._send(method, *args)

    def _send(self, method: str, *args: Any) -> Any:
        """``_call`` without the requests that entered, finished or were admitted
        before it."""
        if not self.engine_id and not self._attach():
            raise wire.NodeUnavailable("not attached")
        self._last_call = time.monotonic()
        try:
            return self.client.call_as(self.engine_id, self._attach_again, ENGINE[method],
                                       *args)
        except wire.NodeUnavailable as exc:
            self._lost(exc)
            raise

    def _attach_again(self) -> str:
        self._forgotten()
        if not self._attach(now=True):
            raise wire.NodeUnavailable("could not attach to the node service again")
        return self.engine_id

    def _forgotten(self) -> None:
        """The service no longer knows this engine: what it had planned for it is void
        (admitted hits become load errors), without a warning (an idle lease ends)."""
        self.engine_id = ""
        self._admitted = []  # their mirrors are queued: load errors below
        for req in self._requests:
            mine = req.books
            mine.params = mine.matched = None
            mine.held_whole = False
            if req.phase is Phase.QUEUED:  # never handed out: a load error, released
                self._failed.append(FailedLoad(req.request_id, mine.blocks, mine.is_async))
                self._release(req)

    # -- the hooks ------------------------------------------------------------------

    def new_request(self, req: RequestView) -> None:
        self._new.append(req)
        if len(self._new) >= MAX_NEW:
            self._send_new()

    def _send_new(self) -> None:
        new, self._new = self._new, []
        for req in new:
            # Its own hook has returned: a refusal must not fail another's.
            with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
                self._send("new_request", req)

    def _send_done(self) -> None:
        done, self._done = self._done, []
        for req in done:
            with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
                self._send("request_finished", req)

    def _done_with(self) -> tuple[RequestView, ...]:
        """The finished requests that go with this call (sent once)."""
        done, self._done = tuple(self._done), []
        return done

    def _send_admitted(self) -> None:
        admitted, self._admitted = self._admitted, []
        for request_id, block_ids, n in admitted:
            try:
                self._send("after_alloc", request_id, block_ids, n)
            except wire.NodeRefused as exc:
                self._refused([request_id], exc)
            except wire.NodeUnavailable:
                return  # forgotten: every admitted hit is a load error

    def _admitted_with(self) -> tuple[ADMISSION, ...]:
        """The admitted hits that go with this call (sent once)."""
        admitted, self._admitted = tuple(self._admitted), []
        return admitted

    def _refused(self, request_ids: Iterable[str], why: object) -> None:
        """The service did not plan the loads of ``request_ids``: load errors (the
        engine recomputes their blocks), released."""
        for rid in request_ids:
            mirror = self._requests.held(rid)
            if mirror is None or mirror.phase is not Phase.QUEUED:
                continue
            mine = mirror.books
            logger.warning("FlatCake: the load of request %s was not planned (%s): its "
                           "%d blocks are recomputed", rid, why, len(mine.blocks))
            self._failed.append(FailedLoad(rid, mine.blocks, mine.is_async))
            mine.planned = mine.held_whole = False
            self._release(mirror)

    def num_matched_tokens(self, req: RequestView, num_local_tokens: int
                           ) -> tuple[int | None, bool]:
        new, self._new = self._new, []
        # Its own new_request (prompt tokens, keys) is the lookup's view: sent once.
        others = tuple(r for r in new if r.request_id != req.request_id)
        entered = len(others) < len(new)
        try:
            n, is_async, params, sources, refused, whole = self._call(
                "num_matched_tokens", req, num_local_tokens, entered, others,
                self._done_with(), self._admitted_with())
        except wire.NodeUnavailable:
            return 0, False
        self._refused(refused, "the node service refused it")
        mine = self._mirror(req.request_id).books
        mine.params, mine.sources, mine.held_whole = params, sources, whole
        if n:
            bs = self.geometry.tokens_per_block
            mine.matched = (num_local_tokens // bs, is_async)
        return n, is_async

    def _mirror(self, request_id: str) -> Tracked[_Mirror]:
        """The request's mirror, admitted on first use."""
        return (self._requests.held(request_id)
                or self._requests.admit(request_id, _Mirror()))

    def _release(self, req: Tracked[_Mirror]) -> None:
        """The request's load ended (a load error where it never started): the engine
        may run it."""
        if req.phase is Phase.QUEUED:
            self._requests.move(req, Event.START)
        self._requests.move(req, Event.REPORT)
        self._requests.move(req, Event.RELEASE)

    def after_alloc(self, request_id: str, block_ids: Sequence[int],
                    num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        mirror = self._mirror(request_id)
        local, is_async = mirror.books.matched or (0, False)
        mirror.books.matched = None
        bs = self.geometry.tokens_per_block
        mine = tuple(block_ids[local:local + num_external_tokens // bs])
        if not self.engine_id:  # the service was lost since the lookup
            self._failed.append(FailedLoad(request_id, mine, is_async))
            mirror.books.held_whole = False
            return
        if mirror.phase is Phase.QUEUED:  # planned before, never handed out
            self._release(mirror)
        self._requests.move(mirror, Event.PLAN)
        mirror.books.blocks = mine
        mirror.books.is_async, mirror.books.planned = is_async, True
        # Planned by the service with the next call: a refusal is a load error then.
        self._admitted.append((request_id, list(block_ids), num_external_tokens))

    def hit_sources(self, request_id: str) -> tuple[int, int]:
        mirror = self._requests.held(request_id)
        if mirror is None:
            return 0, 0
        out, mirror.books.sources = mirror.books.sources, (0, 0)
        return out

    def prompt_computed(self, req: RequestView, block_ids: Sequence[int]
                        ) -> StorePlan | None:
        if self._held_whole(req.request_id):
            return None
        try:
            plan: StorePlan | None = self._call("prompt_computed", req, list(block_ids))
        except (wire.NodeUnavailable, wire.NodeRefused):
            return None
        if plan is not None:
            self._pending_stores = True
            self._mirror(req.request_id).books.store = plan
        return plan

    def build_step(self, preempted: Sequence[str] = (),
                   computed: Sequence[tuple[RequestView, Sequence[int]]] = ()) -> StepPlan:
        failed, self._failed = tuple(self._failed), []
        computed = [c for c in computed if not self._held_whole(c[0].request_id)]
        if not (self._requests.num(Phase.QUEUED) or preempted or computed or self._done
                or self._keepalive()) or not self.engine_id:
            # Nothing to hand out (a store or restore in flight ends with the workers'
            # report, the update): only file work another engine left could be
            # waiting, and the next step that has something collects it.
            return StepPlan(failed_loads=failed)
        try:
            plan, self._pending_stores, events, refused = self._call(
                "step", tuple(preempted), tuple((r, list(ids)) for r, ids in computed),
                self._done_with(), self._admitted_with())
        except (wire.NodeUnavailable, wire.NodeRefused):
            return StepPlan(failed_loads=(*failed, *self._take_failed()))
        self._refused(refused, "the node service refused it")
        self._events.extend(events)
        for store in plan.stores:
            self._mirror(store.request_id).books.store = store.plan
        for task in plan.loads:
            mirror = self._requests.held(task.request_id)
            if mirror is None or mirror.phase is not Phase.QUEUED:
                continue
            self._requests.move(mirror, Event.START)
            if task.sync:  # it runs in this step
                self._release(mirror)
            # else: started, its blocks the restore's target until the service releases it
        failed = (*failed, *self._take_failed())  # and those of a re-attach just now
        if failed:
            plan = replace(plan, failed_loads=failed)
        return plan

    def _held_whole(self, request_id: str) -> bool:
        """Its lookup found its whole prompt held: computing it stores nothing."""
        mirror = self._requests.held(request_id)
        return mirror is not None and mirror.books.held_whole

    def _keepalive(self) -> bool:
        """Work in flight, and the service has not heard from us for a while."""
        return bool(self._pending_stores or self._requests.num(Phase.STARTED)) and \
            time.monotonic() - self._last_call > self._keepalive_s

    def _take_failed(self) -> list[FailedLoad]:
        out, self._failed = self._failed, []
        return out

    def has_pending_stores(self) -> bool:
        return self._pending_stores

    def on_report(self, report: WorkerReport) -> None:
        self._report = report

    def take_released(self, reported: Iterable[str]) -> list[str]:
        """The report and the released restores in one call (``update``); requests the
        service does not know (unplanned loads) pass through as the embedded half's."""
        report, self._report = self._report, None
        reported = list(reported)
        if (report is None or report.is_empty()) and not reported and not self._done:
            return []
        for done in report.loads if report is not None else ():
            if done.late or done.num_blocks_loaded < done.num_blocks:
                # Blocks of its hit are computed: its step may store them again.
                mirror = self._requests.held(done.request_id)
                if mirror is not None:
                    mirror.books.held_whole = False
        try:
            released, self._pending_stores, events, loaded = self._call(
                "update", report, reported, self._done_with())
        except (wire.NodeUnavailable, wire.NodeRefused):
            # Without the books, every restore the workers finished runs now.
            self._released(reported)
            return reported
        self._events.extend(events)
        for rid, params in loaded.items():  # their loads ended: answered here from now
            mirror = self._requests.get(rid)
            if mirror is not None:
                mirror.books.params, mirror.books.planned = params, False
        self._released(released)
        return list(released)

    def _released(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            mirror = self._requests.held(rid)
            if mirror is not None and mirror.phase is Phase.STARTED:
                self._release(mirror)

    def request_finished(self, req: RequestView) -> tuple[bool, dict[str, Any] | None]:
        rid = req.request_id
        mirror = self._requests.held(rid)
        books = mirror.books if mirror is not None else _Mirror()
        params, stored, planned = books.params, books.store, books.planned
        books.params = books.matched = books.store = None
        books.planned = False
        self._requests.finish(rid)
        if not planned and (params is not None or stored is None):
            # No load in flight: the books would answer what this half knows (its
            # lookup's params or its ended load's, its store; none when they never
            # looked it up: ``SchedulerSide.request_finished``); they learn of it with
            # the next call.
            self._done.append(replace(req, keys=()))
            if params is None:
                return False, None
            mine = dict(params["flatcake"])
            if stored is not None:
                mine.update(store_params(stored))
            return stored is not None, {"flatcake": mine}
        try:
            out: tuple[bool, dict[str, Any] | None] = self._call("request_finished", req)
        except (wire.NodeUnavailable, wire.NodeRefused):
            # A restore running keeps its blocks (started: async, not yet released).
            return mirror is not None and mirror.phase is Phase.STARTED, None
        return out

    def take_events(self) -> list[BlockEvent]:
        out, self._events = self._events, []
        return out

    def take_stats(self) -> dict[str, int | float]:
        """The service's counters since the last ask and its gauges (at most every
        ``stats_every_s``: {} between)."""
        now = time.monotonic()
        if not self.engine_id or now < self._stats_due:
            return {}
        self._stats_due = now + self.stats_every_s
        try:
            stats: dict[str, int | float] = self._call("take_stats")
        except (wire.NodeUnavailable, wire.NodeRefused):
            return {}
        return stats

    def num_pending_stores(self) -> int:
        return int(self._pending_stores)

    def close(self) -> None:
        if self.engine_id:
            with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
                self.client.call(verbs.DETACH, self.engine_id)
        self.client.close()
