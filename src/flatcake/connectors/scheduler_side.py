"""The connector's scheduler half: FlatCake's books inside the engine scheduler.

Books only: no torch, no store, no readers; no I/O except the header scan at start-up
(``cio.scan``, the restart scan the store uses too). It builds the same tasks as
``FlatCakeStore`` (``plan.requests``) and keeps damage in the same books (``control.damage``);
the worker half runs them on the same executor. Engine-neutral: it sees requests as
``RequestView`` values, so it runs in tests without vLLM. Per request::

    num_matched_tokens   lookup of the request's block keys; a store still in flight
                         for its next block -> "ask again" (None); all-memory hit ->
                         sync load; any SSD block -> async load (request waits),
                         sync where ``ssd_in_step`` (a host-memory KV), a miss
                         while a given-up load still reads (``disk_late``); in a
                         cluster, then the blocks other nodes hold (``cluster_side``:
                         async load, local-only when Redis fails)
    after_alloc          prepare_load (sessions pinned); sync -> this step's plan;
                         SSD -> FC-MAS queue (priority 1 + wait / kv bytes)
    prompt_computed      the step that computes the rest of the prompt is scheduled
                         (``build_step``'s ``computed``):
                         placement with the session signals (all known before the
                         turn runs), prepare_store (address allocated, published only
                         once every worker wrote it); the worker writes the prompt's
                         new full blocks after that step's forward pass; the not-yet
                         homes the reclaim it ran hands over are stores too, which the
                         workers write from their arenas (``StorePlan.home``)
    build_step           sync loads (all run in this step: in FC-MAS's order, the
                         all-memory ones first, then the SSD ones by priority)
                         + async SSD restores FC-MAS starts now (at most
                         max_restores_in_flight in flight; the rest wait, never
                         cancelled) + stores + file drops -> StepPlan
    on_report            complete_store / complete_load, restore_done; FC-MAS's
                         ready queue releases the restored requests in its order
                         (``take_released``: the engine schedules those); a damaged
                         segment stops being served and its session is cut before it;
                         in a cluster the segments the books drop go to the node's
                         member of the index (the worker embedded, the node service
                         attached), which removes their entries; attached, the
                         service also publishes each store every worker reported
    request_finished     the session learns the reply's length; a request with a
                         store keeps its blocks until every worker wrote it

Single-threaded: the engine's scheduler thread calls everything.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from flatcake.cio.holes import releases_windows
from flatcake.cio.names import SESSIONS_DIR
from flatcake.cio.scan import recover_files
from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.connectors.cluster_side import NodeMember, member_lookup, scheduler_lookup
from flatcake.connectors.requests import (
    COUNTER_KEYS,
    BlockEvent,
    Counters,
    RequestBooks,
    RequestView,
    StoreBooks,
)
from flatcake.control import ControlPlane, FileCut, ReclaimAction, StorePlan
from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit
from flatcake.control.signals import (
    PrefixRefcount,
    SessionTracker,
    hit_owner,
    max_branch_blocks,
)
from flatcake.control.types import WindowRelease
from flatcake.control.wear import wear_increments
from flatcake.errors import CapacityError
from flatcake.geometry import KVGeometry
from flatcake.plan.driver import RequestDriver, Tracked
from flatcake.plan.requests import (
    FileWork,
    Servable,
    by_medium,
    finish_load,
    load,
    reads_ssd,
    reclaim_tasks,
    servable,
    settle,
    store_task,
)
from flatcake.plan.tasks import (
    FileDrop,
    StepPlan,
    StoreDone,
    StoreTask,
    WorkerReport,
)

logger = logging.getLogger(__name__)
# Steps whose window releases an engine's workers may not have started when it stops:
# vLLM builds at most one step ahead of the one its workers run; four leave margin
# (a range punched twice is harmless, ``control.releases``).
HANDED_STEPS = 4
# The request id of a write-back's store task (``_write_backs``): no engine request.
WRITE_BACK = "flatcake-write-back-"

__all__ = ["COUNTER_KEYS", "BlockEvent", "RequestView", "SchedulerSide"]


class SessionScope(Protocol):
    """A node service engine's tenant over the shared books
    (``service.tenants.TenantScope``): each raises ``ValueError`` for what names a
    session of another tenant."""

    def check_hit(self, hit: PrefixHit) -> None: ...

    def check_write(self, session_id: str, keys: tuple[bytes, ...]) -> None: ...

    def sees(self, session_id: str) -> bool:
        """Whether the session is this tenant's (others' block events are not its)."""
        ...

    def name(self, explicit: object) -> object:
        """The books' name of the session a request names (each tenant names its own)."""
        ...

    @property
    def prefix(self) -> str:
        """The prefix of the sessions the engine starts without a name."""
        ...

    def own(self, session_id: str) -> str:
        """The tenant's name of the books' session ``session_id``."""
        ...


@dataclass(frozen=True, slots=True)
class NodeParts:
    """What the engines of one store share: the books, the conversations they infer
    and the live requests' prefix refcounts. One per engine embedded; one per machine
    in a node service (``flatcake.service``), every attached engine's half over it."""

    control: ControlPlane
    sessions: SessionTracker
    refcount: PrefixRefcount
    recovered_segments: int
    cluster: NodeMember | None = None  # the node service's membership of a cluster
    # The node service deletes and cuts the files the books drop and punches the window
    # rows they release itself (no engine's workers are handed another engine's, or
    # another tenant's, files): (drops, cuts, releases).
    files: FileWork | None = None

    @classmethod
    def embedded(cls, geometry: KVGeometry, cfg: FlatCakeConfig, store_dir: Path,
                 clock: Clock, write_backs: bool = False) -> NodeParts:
        """Fresh books over ``store_dir``, re-indexed from its segments (headers only:
        data crcs are checked on every load; the worker half or the service settles
        the files themselves). The books release superseded window rows where the
        workers can punch them out (``cio.holes.releases_windows``): each step hands
        them over (``StepPlan.releases``), and a restart releases again what a crash
        left unpunched. ``write_backs``: the workers write the not-yet homes memory
        reclaim hands over from their arenas (``ControlPlane(write_backs=...)``): an
        engine's own books, not a node service's (whose workers are other engines')."""
        release = releases_windows(bool(cfg.store.release_old_windows
                                        and geometry.layer_window_blocks),
                                   store_dir / SESSIONS_DIR)
        control = ControlPlane(geometry, cfg, clock, release_windows=release,
                               write_backs=write_backs)
        recovered = recover_files(control, store_dir / SESSIONS_DIR)[1].num_segments
        sessions = SessionTracker(cfg.engine.infer_sessions, cfg.engine.max_sessions,
                                  max_branch_blocks=max_branch_blocks(cfg.placement, geometry))
        return cls(control, sessions, PrefixRefcount(), recovered)


class SchedulerSide:
    """Control plane of one vLLM instance (see the module docstring).

    Attributes:
        control: the FlatCake control plane (index, placement, allocation, FC-MAS).
        geometry: per-worker KV geometry of the engine.
        config: the configuration; the engine keys are its ``engine`` section.
        world_size: workers that each report every task (tensor parallel size).
        async_loads: every load is async, an all-memory one too (an engine that
            learns a failed load only by request: vLLM with several KV cache groups).
        ssd_in_step: an SSD load runs in the step that schedules its request, the
            forward pass waiting for each layer as for an all-memory one (an engine
            whose KV is in host memory: the restore overlaps the forward's layers
            instead of a step ending before the engine learns it finished and another
            computing the rest); a hit reaching other nodes stays async.
        scope: a node service's engine's tenant (``SessionScope``): a hit holding
            another tenant's session is a miss, a turn naming one is not stored, and
            the engine's block events leave out other tenants' blocks.

    A load in the step given up at its deadline (``LoadDone.late``) may still be
    reading: the disk hangs. Until every worker reports its reads ended
    (``WorkerReport.late_ended``), an SSD hit that would load in the step is planned
    as a miss (``disk_late``; counted in ``loads_backed_off``), so no later step waits
    the deadline again; all-memory hits still load. A miss rather than an async load:
    an async restore has no deadline, so on a hung disk its request would wait in the
    engine's remote-KV state as long as the disk hangs, holding a staging window the
    restores queued behind it wait for; a miss costs one prefill, bounded.
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig, store_dir: Path,
                 *, world_size: int = 1, clock: Clock | None = None,
                 node: NodeParts | None = None, queue: Hashable = None,
                 async_loads: bool = False, ssd_in_step: bool = False,
                 scope: SessionScope | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.geometry = geometry
        # Fixed for the process; asked on every lookup (``_held_whole``).
        self._windows = bool(geometry.layer_window_blocks)
        self.config = config
        self.world_size = world_size
        self.async_loads = async_loads
        self.ssd_in_step = ssd_in_step and not async_loads
        self.store_dir = Path(store_dir)
        # A node service's engine: the node's books, sessions and prefix refcounts,
        # shared with every engine attached to it, and an FC-MAS queue of its own.
        self.node = node
        self.queue = queue
        self.scope = scope
        if node is None:
            node = NodeParts.embedded(geometry, config, self.store_dir,
                                      clock if clock is not None else WallClock(),
                                      write_backs=True)
        self.control = node.control
        self._wear = self.control.ssd_wear()  # take_stats reports the growth since
        self.sessions = node.sessions
        self.refcount = node.refcount
        self.recovered_segments = node.recovered_segments
        # Each request's life (``plan.driver``): its books, its load's phase, the
        # workers' reports, FC-MAS's release order, the given-up reads still running.
        self.requests: RequestDriver[RequestBooks] = RequestDriver(
            self.control, world_size=world_size, queue=queue)
        self.stores = StoreBooks(world_size)
        self._drops: list[FileDrop] = []
        self._file_cuts: list[FileCut] = []
        self.counters = Counters()
        self._stats = self.counters.stats
        self._events: list[BlockEvent] = []
        self._unpublish: list[tuple[int, tuple[bytes, ...]]] = []
        # The window releases of the last steps built: their workers may not have
        # punched them yet (``abandon`` gives them back to the books).
        self._handed: deque[tuple[WindowRelease, ...]] = deque(maxlen=HANDED_STEPS)
        self.cluster = (scheduler_lookup(geometry, config, world_size, self._stats)
                        if self.node is None else member_lookup(geometry, config,
                                                                self.node.cluster, self._stats))

    # -- restart ---------------------------------------------------------------------

    def num_matched_tokens(self, req: RequestView, num_local_tokens: int
                           ) -> tuple[int | None, bool]:
        """``get_num_new_matched_tokens``: tokens FlatCake can load beyond the
        ``num_local_tokens`` the engine already has, and whether the load is async.

        ``(None, False)`` asks the engine to try again next step: a store of this
        prefix is still being written, and its blocks will hit once durable."""
        bs = self.geometry.tokens_per_block
        # Leave at least one token to compute: the engine samples from its logits.
        max_blocks = min(len(req.keys), max(req.num_tokens - 1, 0) // bs)
        keys = req.keys[:max_blocks]
        local_blocks = num_local_tokens // bs
        found = servable(self.control, keys, local_blocks)
        if self.scope is not None and found.hit.runs:
            try:
                self.scope.check_hit(found.hit)
            except ValueError as exc:
                logger.warning("FlatCake: request %s looked up as a miss: %s",
                               req.request_id, exc)
                found = Servable(PrefixHit(0, 0, 0, ()), False)
        if found.wait:
            # A store of this prefix is being written and reaches past what the
            # engine holds itself: wait for it rather than recompute it.
            self._stats["lookup_waits"] += 1
            return None, False
        hit = found.hit
        remote = () if self.cluster is None else self.cluster.runs(
            req.request_id, keys, max(hit.num_blocks, local_blocks))
        end = remote[-1].end if remote else hit.num_blocks
        tracked = self.requests.get(req.request_id)
        if tracked is None:
            # The turn continues the conversation owning the end of the local hit; its
            # history is everything the cluster holds of the prompt.
            owner = hit_owner(self.control, hit)
            explicit, prefix = req.session_param, ""
            if self.scope is not None:  # the tenant's own names
                explicit, prefix = self.scope.name(explicit), self.scope.prefix
            turn = self.sessions.resolve(explicit, end, owner, prefix)
            tracked = self.requests.admit(req.request_id, RequestBooks(turn))
            if not self.refcount.holds(req.request_id):
                self.refcount.add(req.request_id, req.keys)
        state = tracked.books
        state.hit, state.local_blocks, state.remote = hit, local_blocks, remote
        state.held_whole = self._held_whole(req, hit)
        if state.held_whole:  # its session touched now, as a store of nothing touches it
            with contextlib.suppress(KeyError):
                self.control.touch(state.turn.session_id)
        num_blocks = end - local_blocks
        if num_blocks < self.config.engine.min_hit_blocks:
            return 0, False
        ssd = reads_ssd(hit, local_blocks)
        if self.ssd_in_step and not remote and ssd and self.disk_late():
            # Would wait for a hung disk in the step: a miss.
            if not state.backed_off:
                state.backed_off = True
                self._stats["loads_backed_off"] += 1
            return 0, False
        # Async when the part past the engine's own blocks reads SSD (the load's rule).
        return num_blocks * bs, (self.async_loads or bool(state.remote) or (
            ssd and not self.ssd_in_step))

    def _held_whole(self, req: RequestView, hit: PrefixHit) -> bool:
        """Whether the books hold every full block of ``req``'s prompt (``hit``: its
        lookup's, from block 0): the step computing it stores nothing (``prepare_store``
        finds nothing new), so an attached engine leaves it out of that step
        (``held_whole``). Never with sliding windows (a prompt held whole may still
        store the window at its end)."""
        if self._windows:
            return False
        n = min(len(req.keys), req.num_prompt_tokens // self.geometry.tokens_per_block)
        if hit.num_blocks >= n:
            return True
        # The lookup leaves the prompt's last token to compute: a prompt of whole
        # blocks has its last block past the hit.
        locate = self.control.locate
        return hit.num_blocks >= n - 1 and all(map(locate, req.keys[hit.num_blocks:n]))

    def held_whole(self, request_id: str) -> bool:
        """Whether the last lookup of the live request found every full block of its
        prompt held (``_held_whole``)."""
        tracked = self.requests.get(request_id)
        return tracked is not None and tracked.books.held_whole

    def disk_late(self) -> bool:
        """A load given up at its deadline is still reading on some worker."""
        return self.requests.disk_late()

    def hit_sources(self, request_id: str) -> tuple[int, int]:
        """Tokens of the admitted hit (beyond the local prefix) in memory and on SSD."""
        tracked = self.requests.get(request_id)
        if tracked is None or tracked.task is None:
            return 0, 0
        return self.looked_up_sources(request_id)

    def looked_up_sources(self, request_id: str) -> tuple[int, int]:
        """``hit_sources`` of the hit as last looked up, admitted or not (the node
        service answers it with the lookup)."""
        tracked = self.requests.get(request_id)
        if tracked is None:
            return 0, 0
        state = tracked.books
        mem, ssd = by_medium(state.hit, state.local_blocks, state.hit.num_blocks)
        bs = self.geometry.tokens_per_block
        return mem * bs, ssd * bs

    def after_alloc(self, request_id: str, block_ids: Sequence[int],
                    num_external_tokens: int) -> None:
        """``update_state_after_alloc``: plan the load of an admitted hit."""
        if num_external_tokens <= 0:
            return
        tracked = self.requests.get(request_id)
        if tracked is None:
            raise ValueError(f"request {request_id!r}: the engine admitted external "
                             "tokens the books never looked up")
        state = tracked.books
        bs = self.geometry.tokens_per_block
        hit = state.hit
        num_blocks = state.local_blocks + num_external_tokens // bs
        end = state.remote[-1].end if state.remote else hit.num_blocks
        if num_blocks != end:
            raise ValueError(f"request {request_id!r}: the engine admitted "
                             f"{num_external_tokens} external tokens, the hit has "
                             f"{end - state.local_blocks} blocks")
        if len(block_ids) < num_blocks:
            raise ValueError(f"request {request_id!r}: {len(block_ids)} block ids for "
                             f"{num_blocks} hit blocks")
        first = state.local_blocks
        task, plan = load(self.control, request_id, hit, block_ids, first, state.remote)
        # An all-memory load takes no FC-MAS slot: it runs in this step, async where
        # every load is (its request waits a step for it).
        in_step = task.sync or (self.ssd_in_step and not task.remote)
        sync = in_step and not self.async_loads
        if sync != task.sync:  # most loads keep the books' choice: no second copy
            task = replace(task, sync=sync)
        self.requests.plan(tracked, task, plan, in_step=in_step)
        self._stats["hit_tokens"] += (num_blocks - first) * bs
        state.hit_blocks += num_blocks - first

    # -- steps -----------------------------------------------------------------------

    def build_step(self, preempted: Sequence[str] = (),
                   computed: Sequence[tuple[RequestView, Sequence[int]]] = ()) -> StepPlan:
        """``build_connector_meta``: this step's loads, stores and file drops;
        ``preempted``: requests the engine preempted in this step; ``computed``: the
        requests whose prompt this step computes, with their block ids, each
        ``prompt_computed`` first (their stores are the plan's, one call attached)."""
        for req, block_ids in computed:
            self.prompt_computed(req, block_ids)
        # Every load in the step runs in it, side by side, in FC-MAS's order.
        loads = self.requests.take_step()
        if self.requests.num_waiting:  # else this side's FC-MAS queue has nothing to start
            fcmas = self.requests.fcmas
            before = fcmas.stats.num_slot_waits
            started = self.requests.start_restores()
            self._stats["staging_slot_waits"] += fcmas.stats.num_slot_waits - before
            self._stats["restores_started"] += len(started)
            loads += started
        stores = self.stores.take_new()
        self._settle_damage()
        drops, self._drops = self._drops, []
        cuts, self._file_cuts = self._file_cuts, []
        # Of the preempted requests, those with a store in flight (most steps: none).
        kept = tuple(r for r in preempted if r in self.stores.writing()) if preempted else ()
        unpublish, self._unpublish = self._unpublish, []
        releases = tuple(self.control.take_window_releases())
        files = self.node.files if self.node is not None else None
        handed = releases
        if files is not None and releases:  # the node service punches them itself
            files((), (), releases)
            handed = ()
        self._handed.append(handed)
        for rel in releases:  # no hit ends in their blocks any more (``control.windows``)
            seg = self.control.segment(rel.segment_id)
            if self.scope is None or self.scope.sees(seg.session_id):
                self._events.append(BlockEvent(False, seg.keys, seg.medium, rel.layers))
        return StepPlan(tuple(t.task for t in loads if t.task is not None), tuple(stores),
                        tuple(drops), tuple(cuts), kept, tuple(unpublish), releases=handed)

    def on_report(self, report: WorkerReport) -> None:
        """``update_connector_output``: completions reported by the workers."""
        for stored in report.stores:
            self._store_done(stored)
        for done in report.loads:
            if done.late:
                self.requests.count_late(done.request_id, 1)
            tracked = self.requests.gather(done)
            if tracked is not None:
                self._load_done(tracked)
        for rid in report.late_ended:  # may come before its late report: a count
            self.requests.count_late(rid, -1)
        self._settle_damage()

    def _store_done(self, done: StoreDone) -> None:
        finished = self.stores.done(done)
        if finished is None:
            return
        task, ok, reports = finished
        plan = task.plan
        self.control.complete_store(plan, ok)
        member = self.node.cluster if self.node is not None else None
        if ok and member is not None:  # durable and in the books: the node publishes it
            member.publish(plan.segment, reports)
        medium = "memory" if plan.medium == Medium.MEMORY else "ssd"
        self._stats["stores_ok" if ok else "stores_failed"] += 1
        if ok:
            self._stats[f"stored_blocks_{medium}"] += plan.segment.num_blocks
            self._events.append(BlockEvent(True, plan.segment.keys, plan.medium))

    def _load_done(self, tracked: Tracked[RequestBooks]) -> None:
        reports, task = tracked.reports, tracked.task
        finished = finish_load(self.control, tracked.request_id, reports)
        self.requests.reported(tracked)
        if tracked.slot:
            self.requests.release_ready()
        if not tracked.finished and task is not None:
            tracked.books.count_load(task, finished.num_blocks_loaded, self._stats,
                                     self.geometry.tokens_per_block)
            self._stats["damaged_segments"] += len(finished.failed_segments)
            self._stats["loads_staged"] += any(r.staged for r in reports)
            self._stats["loads_late"] += any(r.late for r in reports)

    def take_released(self, reported: Iterable[str]) -> list[str]:
        """Of the SSD restores the workers ``reported`` finished, and those held before,
        the ones FC-MAS's ready queue released, in its order: the requests the engine
        may schedule now (in single-queue mode a restored request waits behind an
        earlier one still restoring)."""
        return self.requests.take_released(reported)

    def _settle_damage(self) -> None:
        self._apply(settle(self.control))

    def _apply(self, actions: Sequence[ReclaimAction]) -> None:
        if not actions:  # the common case: every step and report settles nothing
            return
        gone = []
        for action in actions:
            for seg in (*action.memory_segments, *action.ssd_segments):
                if self.scope is None or self.scope.sees(seg.session_id):
                    self._events.append(BlockEvent(False, seg.keys, seg.medium))
                gone.append((seg.segment_id, seg.keys))
        member = self.node.cluster if self.node is not None else None
        if member is not None:  # the node service is the member: it removes them
            member.remove(gone)
        elif self.cluster is not None:  # the worker is the member
            self._unpublish.extend(gone)
        cuts, drops = reclaim_tasks(actions)
        files = self.node.files if self.node is not None else None
        if files is not None:
            if cuts or drops:
                files(drops, cuts, ())
            return
        self._file_cuts.extend(cuts)
        self._drops.extend(drops)

    # -- finish ----------------------------------------------------------------------

    def prompt_computed(self, req: RequestView, block_ids: Sequence[int]) -> StorePlan | None:
        """The step that computes the rest of ``req``'s prompt is being scheduled: place
        and allocate the prompt's full blocks FlatCake does not hold (one segment per
        turn). The worker writes them after this step's forward pass; a reply's blocks
        are stored as part of the next turn's prompt. At most once per request."""
        tracked = self.requests.get(req.request_id)
        if tracked is None or tracked.books.store_planned:
            return None
        state = tracked.books
        state.store_planned = True
        bs = self.geometry.tokens_per_block
        n = min(len(req.keys), req.num_prompt_tokens // bs, len(block_ids))
        if n <= 0:
            return None
        keys = req.keys[:n]
        refcount = self.refcount

        def shared(i: int) -> int:
            """Live requests holding the first block written (``keys[i]``)."""
            return max(refcount.refcount(keys[i], i), 1)

        turn = state.turn
        if self.scope is not None:
            try:
                self.scope.check_write(turn.session_id, tuple(keys))
            except ValueError as exc:
                logger.warning("FlatCake does not store request %s: %s", req.request_id,
                               exc)
                return None
        try:
            # None: nothing new, or only blocks another request is writing now.
            plan = self.control.prepare_store(
                turn.session_id, keys, turn_index=turn.turn_index,
                context_tokens=req.num_prompt_tokens,
                prev_reply_tokens=turn.prev_reply_tokens, shared_refcount=shared,
                # The engine holds a sliding window's rows from this step's first block
                # on (it frees blocks behind the window as chunks are computed).
                rows_from=req.num_computed_tokens // bs)
        except CapacityError as exc:
            self._stats["stores_rejected"] += 1
            logger.warning("FlatCake cannot store request %s: %s", req.request_id, exc)
            plan = None
        self._apply(self.control.take_reclaim_actions())
        self._write_backs()
        if plan is None:
            return None
        task = store_task(req.request_id, plan, block_ids)
        state.store = plan
        self.stores.add(task)
        self.counters.placements[plan.placement.rule.value] += 1
        return plan

    def _write_backs(self) -> None:
        """The not-yet homes memory reclaim hands over (``placement.not_yet_write_back``):
        each an SSD store the workers write from their arenas with the next step
        (``StorePlan.home``), completed as any store once every worker reported it."""
        for plan in self.control.take_write_backs():
            self.stores.add(StoreTask(f"{WRITE_BACK}{plan.segment.segment_id}", plan,
                                      tuple(range(plan.segment.num_blocks))))
            self._stats["write_backs"] += 1

    def request_finished(self, req: RequestView) -> tuple[bool, dict[str, Any] | None]:
        """``request_finished``: the session learns the turn's reply length.

        Returns ``(delay_free, kv_transfer_params)``: ``delay_free`` keeps the request's
        blocks until the workers report its store (a request with a store planned
        always waits for that report, even when the store is already durable, so both
        halves agree without asking each other) or, for a request that finished while
        its restore was in flight, the restore."""
        tracked = self.requests.finish(req.request_id)
        self.refcount.remove(req.request_id)
        if self.cluster is not None:
            self.cluster.forget(req.request_id)
        if tracked is None:
            return False, None
        state = tracked.books
        if tracked.loading:
            # Aborted while its restore runs: the blocks are the restore's target until
            # the worker reports it. A restore still queued in FC-MAS runs all the same
            # (never cancelled); the worker's report of it frees the blocks.
            return True, self._params(state)
        bs = self.geometry.tokens_per_block
        self.sessions.finish_turn(state.turn, req.num_output_tokens,
                                  req.num_prompt_tokens // bs)
        return state.store is not None, self._params(state)

    def _params(self, state: RequestBooks) -> dict[str, Any]:
        """The request's ``kv_transfer_params``, its session by its tenant's name."""
        sid = state.turn.session_id
        return state.params(self.geometry.tokens_per_block,
                            sid if self.scope is None else self.scope.own(sid))

    # -- reporting -------------------------------------------------------------------

    def num_pending_stores(self) -> int:
        """Turn segments planned and not yet reported by every worker."""
        return len(self.stores)

    def has_pending_stores(self) -> bool:
        """Stores planned and not yet reported: the engine must keep stepping."""
        return self.stores.has_pending()

    def has_work(self) -> bool:
        """Anything the next ``build_step`` would hand out or wait on: stores in flight,
        loads planned or queued, file drops, cuts or unpublishing."""
        return (self.stores.has_pending() or self.requests.num_loading > 0
                or bool(self._drops)
                or bool(self._file_cuts) or bool(self._unpublish))

    def take_events(self) -> list[BlockEvent]:
        """Blocks published and dropped since the last call, in order."""
        out, self._events = self._events, []
        return out

    def new_request(self, req: RequestView) -> None:
        """A request entered the engine (``on_new_request``): count its prompt tokens
        (the hit rate's denominator) and its blocks in the prefix-tree refcount from
        now on, waiting or running, so the shared-prefix rule sees every request that
        holds a prefix when the first of them is written."""
        self._stats["prompt_tokens"] += req.num_prompt_tokens
        self.refcount.add(req.request_id, req.keys)

    def request_params(self, request_id: str) -> dict[str, Any] | None:
        """The ``kv_transfer_params`` a live request's ``request_finished`` would return
        now; None for a request the books never looked up."""
        tracked = self.requests.get(request_id)
        return None if tracked is None else self._params(tracked.books)

    def abandon(self) -> list[tuple[StorePlan, int]]:
        """The engine is gone (a node service ended its lease): its restores are
        unpinned, its requests forgotten, the window releases of its last steps handed
        out again, the stores its workers were not handed yet rolled back (never
        published). Returns the stores its workers were handed and may still write, each
        with its workers' reports of it so far (the host rolls them back or fences them:
        ``service.fences``). Its file drops
        and cuts are the node service's (``NodeParts.files``), never queued here."""
        for tracked in self.requests.loading():
            self.control.complete_load(tracked.request_id)
        handed, new = self.stores.abandon()
        for task in new:
            self.control.complete_store(task.plan, False)
        for tracked in self.requests.abandon():
            if not tracked.finished:
                self.refcount.remove(tracked.request_id)
        # Released rows its workers may not have punched: the next engine's punch them.
        self.control.give_back_window_releases(r for step in self._handed for r in step)
        self._handed.clear()
        self._apply(self.control.take_reclaim_actions())
        self._settle_damage()
        return [(t.plan, n) for t, n in handed]

    def close(self) -> None:
        """Close the connection to the cluster index, if any."""
        if self.cluster is not None:
            self.cluster.close()

    def take_stats(self) -> dict[str, int | float]:
        """Counters since the last call (for the engine's stats interval), plus the
        gauges of now; placements are counted under ``placements.<rule>``."""
        in_flight = self.control.restores_in_flight_in(self.queue)
        wear, self._wear = self._wear, self.control.ssd_wear()  # the node's, whole
        self.counters.stats.update(wear_increments(wear, self._wear))
        return self.counters.take({"restores_in_flight": in_flight,
                                   "restores_waiting": self.requests.num_waiting,
                                   "ssd_unread_bytes": self._wear.unread_bytes})

    def totals(self) -> dict[str, int]:
        """Counters since start (what ``take_stats`` handed out plus what it has not)."""
        return self.counters.totals()
