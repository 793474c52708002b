"""The control plane facade: keys, index, placement, allocation, reclaim, read planning
and restore scheduling behind paired lifecycle verbs. No I/O.

The same object runs inside the store (wall clock), the replay simulator (simulated
clock) and tests. The data plane executes what it plans and reports back::

    lookup(keys) ─────────────────────────────► PrefixHit (what can be served now)
    prepare_store(session, keys, signals) ────► StorePlan (address allocated, unpublished)
        data plane writes the segment ...
    complete_copy(plan) ──────────────────────► its memory copy is written: readable now
    complete_store(plan, ok) ─────────────────► published (ok) or allocation freed
    prepare_load(request, keys | hit) ────────► LoadPlan (hit + ReadPlan; sessions pinned)
        data plane reads the plan ...
    complete_load(request) ───────────────────► sessions unpinned and touched
    reclaim() / take_reclaim_actions() ───────► [ReclaimAction] (files to delete or cut,
                                                 arena ranges now free); index updated
    truncate_session(session, segment) ───────► ReclaimAction: a damaged segment and the
                                                 session's later segments unpublished,
                                                 their file tails freed (files to cut)
    mark_damaged(segment, header) ────────────► a segment that failed its checksum stops
                                                 being served (lookup stops before it)
    settle_damage() ──────────────────────────► [ReclaimAction]: its session cut there
                                                 (or dropped, files quarantined, when the
                                                 file header is damaged too), once
                                                 nothing in flight uses the tail
    recover_files(scans) ─────────────────────► Recovery: scanned headers re-indexed, a
                                                 verdict per file (keep / cut / delete /
                                                 quarantine)

The objects behind it, each owning its state (its docstring says what it owns, what
of the shared parts it writes, and who calls it)::

    ControlPlane ── creates the shared parts: index, arena, ssd, copies, scheduler,
      │             the session table, segment ids, the stores / loads in flight, the
      │             reclaim queue; hands each collaborator the ones it needs
      ├─ Books         (books)      the query methods hosts use (reads only)
      ├─ Stores        (stores)     prepare/complete_store, complete_copy; keys in flight
      ├─ Loads         (loads)      prepare/complete_load; the loads in flight
      ├─ Spare         (spare)      memory copies: watermark, refills, copy reads, drops
      ├─ EarlyCopies   (copies)     copies written ahead of their segments
      ├─ Reclaimer     (reclaimer)  reclaim, drop_session, truncate_session
      ├─ Releases      (releases)   window rows superseded by a newer turn
      ├─ Damage        (damage)     damaged segments, pending cuts, bad file headers
      ├─ Restart       (restart)    recover_segment / recover_files (``recovery`` types)
      └─ check_books   (integrity)  the cross-check, reading all of them

Spare memory: while host memory use (the copy included) stays at or under
``placement.memory_copy_watermark``, an SSD-homed turn also gets a *memory copy*
(``StorePlan.copy``; the data plane writes it with the segment). Restores read it in
place of the SSD (``lookup`` reports it) from ``complete_copy`` on, before the segment
is durable (its session stays pinned until then, so the copy cannot go); it is dropped
with its home and first when memory is needed; the home never changes, except that a
copy already readable when its segment's write fails becomes the blocks' memory home.

Invariants: an address is published only once its bytes are durable (``complete_store``
with ``ok=True``); a pinned session (restore reading it, or a write into it in flight)
is never reclaimed; a copy a restore in flight reads stays (other copies are clean and
may go at any time: dropping one cuts nothing); a segment a restore in flight reads, or a write
in flight after it, is never cut; every indexed block of a session is reachable by the
keys that wrote it, unless its prefix runs through a memory-homed block memory reclaim
dropped (nothing else leaves a hole; such a block is never hit, and never served wrong,
until that prefix is stored again); the host and SSD budgets are never exceeded.

Single-threaded: the owner (store, engine scheduler, simulator loop) serialises calls.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Literal

from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.control.alloc import HostArena
from flatcake.control.books import Books
from flatcake.control.copies import EarlyCopies, MemoryCopies
from flatcake.control.damage import Damage
from flatcake.control.index import BlockIndex, PrefixHit, Segment
from flatcake.control.integrity import check_books
from flatcake.control.loads import Loads
from flatcake.control.notyet import NotYet
from flatcake.control.reclaimer import Reclaimer
from flatcake.control.recovery import Recovery, ScannedFile
from flatcake.control.releases import Releases
from flatcake.control.restart import Restart
from flatcake.control.scheduler import MasScheduler
from flatcake.control.sessions import SegmentIds, SessionTable
from flatcake.control.spare import Spare
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.stores import Stores
from flatcake.control.types import LoadPlan, ReclaimAction, StorePlan, WindowRelease
from flatcake.control.wear import Wear
from flatcake.control.windows import window_segment_hit, windowed_hit
from flatcake.geometry import KVGeometry
from flatcake.layout import ALIGN, SegmentLayout
from flatcake.readplan import ReadPlanner


class ControlPlane(Books):
    """Books of one node's FlatCake store (see the module docstring for the verbs).

    The lifecycle verbs are here, the queries in ``Books``; both delegate to the
    collaborators built below and keep no state of their own beyond the references.
    ``geometry``, ``config``, ``clock``, ``node_id`` and ``planner`` (the read planner
    ``prepare_load`` uses when its caller names none: ``ControlPlane(...,
    planner=plan_reads)``; the books import no planner) are fixed at construction.
    ``release_windows``: the host punches released window rows out of its files
    (``take_window_releases``), so the books release them (with
    ``store.release_old_windows``); a host that does not keeps every window.
    ``write_backs``: the host writes not-yet homes reclaim hands it to the SSD
    (``take_write_backs``: the embedded store, the embedded vLLM connector, the
    replay), so ``placement.not_yet_write_back`` applies; a host built without it (the
    node service) refuses the key.
    ``index``, ``arena``, ``ssd``, ``copies``, ``scheduler``: the parts, for the control
    plane's own modules and white-box tests; hosts use the query methods.
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig | None = None,
                 clock: Clock | None = None, *, planner: ReadPlanner | None = None,
                 file_header_bytes: int = ALIGN, release_windows: bool = False,
                 write_backs: bool = False) -> None:
        if not isinstance(geometry, KVGeometry):
            raise ValueError(f"geometry must be a KVGeometry, got {type(geometry).__name__}")
        cfg = self._config = config if config is not None else FlatCakeConfig()
        clk: Clock = clock if clock is not None else WallClock()
        self._geometry, self._clock, self._planner = geometry, clk, planner
        store = cfg.store
        node = self._node_id = store.node_id
        # The shared parts: each is written through its own methods only.
        index = self.index = BlockIndex()
        arena = self.arena = HostArena(store.memory_capacity_bytes)
        ssd = self.ssd = SsdSpace(store.node_id, store.ssd_capacity_bytes,
                                  store.session_file_bytes, file_header_bytes)
        self.scheduler = MasScheduler(cfg.scheduler, clk)
        self._queues: dict[Hashable, MasScheduler] = {}  # an attached engine's own
        copies = self.copies = MemoryCopies()
        sessions = self._sessions = SessionTable(ssd)
        ids = SegmentIds()
        # Written by Stores / Loads alone; the Reclaimer reads them (what is in flight).
        pending: dict[int, StorePlan] = {}
        loads: dict[Hashable, LoadPlan] = {}
        # Reclaim actions not taken yet: Spare (copies dropped) and the Reclaimer append,
        # the Reclaimer drains (take_reclaim_actions).
        actions: list[ReclaimAction] = []
        damage = self._damage = Damage(index, sessions)
        wear = self._wear = Wear()
        early = EarlyCopies()
        spare = self._spare = Spare(cfg, geometry, node, index, arena, copies, sessions, ids,
                                    actions)
        if cfg.placement.not_yet_write_back and not write_backs:
            raise ValueError(
                "invalid config placement.not_yet_write_back=True: the node service "
                "does not write not-yet homes from host memory to the SSD (its engines' "
                "workers do the I/O), so it refuses the key; the embedded store, the "
                "embedded vLLM connector and the replay write them (leave it false for "
                "a node service)")
        not_yet = NotYet(index, arena, sessions, pending)
        # Reclaim writes not-yet homes back through the stores made below.
        backs = write_backs and cfg.placement.not_yet and cfg.placement.not_yet_write_back
        reclaimer = self._reclaimer = Reclaimer(
            cfg, index, arena, ssd, copies, sessions, spare, damage, actions, pending, loads,
            wear, not_yet if backs else None,
            (lambda seg, first: stores.write_back(seg, first)) if backs else None, clk.now)
        releases = self._releases = Releases(
            index, ssd, sessions, geometry.layer_window_blocks,
            store.release_windows_at_once) \
            if release_windows and store.release_old_windows and \
            geometry.layer_window_blocks else None
        stores = self._stores = Stores(cfg, geometry, clk, node, index, arena, ssd, sessions,
                                       ids, spare, early, reclaimer, pending, releases,
                                       lambda keys: self.lookup(keys).num_blocks, wear,
                                       not_yet)
        self._loads = Loads(cfg, geometry, clk, planner, index, copies, sessions, spare, early,
                            self.lookup, loads, wear)
        self._restart = Restart(geometry, clk, node, index, ssd, sessions, ids)
        # The lookup path runs on every request: its steps bound once, and the parts a
        # lookup or a step may skip (most hold nothing) read through their views, so an
        # empty one is never called: copies, early copies, damage, reclaim actions.
        self._index_lookup = index.lookup
        self._extend_early = early.extend
        self._servable = damage.servable
        self._windows = geometry.layer_window_blocks
        self._copy_homes, self._early_keys = copies.by_home, early.by_key
        self._damaged, self._cut_at, self._actions = damage.damaged, damage.cut_at, actions

    # -- lookup ----------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> PrefixHit:
        """The longest servable prefix of ``keys`` (published segments only, stopped
        before a segment marked damaged), with the memory copy of an SSD segment in its
        place where one is held. The copies it reports become the most recently used (a
        request is about to use them, as a tiered store's LRU refreshes the blocks a
        lookup matched)."""
        req = keys if isinstance(keys, tuple) else tuple(keys)
        hit = self._index_lookup(req)
        if self._copy_homes and hit.num_ssd_blocks:
            copies = self.copies
            copies.touch_hit(hit)
            hit = copies.substitute(hit)
        if self._early_keys:
            hit = self._extend_early(req, hit)
        if self._damaged:
            hit = self._servable(hit)
        if not self._windows or not hit.runs:
            return hit
        got = windowed_hit(hit, self._windows)
        if got.num_blocks < hit.num_blocks:
            # The hit's end holds no window along its runs: a window segment written
            # there (a request whose whole prompt was stored) may hold it.
            alt = window_segment_hit(hit, req, self._windows, self.index.holders)
            if alt is not None:
                alt = self._servable(alt)
                if alt.num_blocks > got.num_blocks:
                    return windowed_hit(alt, self._windows)
        return got

    # -- store -----------------------------------------------------------------------

    def prepare_store(
        self,
        session_id: str,
        keys: Sequence[bytes],
        *,
        turn_index: int,
        context_tokens: int,
        prev_reply_tokens: int | None = None,
        shared_refcount: int | Callable[[int], int] = 1,
        rows_from: int = 0,
    ) -> StorePlan | None:
        """Place and allocate the blocks of ``keys`` that are not indexed yet.

        ``shared_refcount``: live requests sharing the first block this call writes,
        or a function from that block's index in ``keys`` to the count. Only this call
        knows which block that is (another request may have stored part of the prompt
        since the request arrived), so every host passes the function: the signal is
        taken at the block that is really written, the same way everywhere.

        ``keys`` are the request's block keys (history + new prompt). The blocks after
        the hit prefix become one new segment. Every block already indexed, but no window
        held where ``keys`` end (a windowed model's prompt ending inside another turn):
        the last window's blocks become the segment, so a later hit ending there is
        served (``windows.window_segment_hit``). A prompt that branches off a stored
        prefix where no window is held starts its segment a window before the branch
        and keeps its window rows from there on (``store.windows_at_branches``), when
        that window lies at or after request block ``rows_from`` (the first block whose
        rows the caller still holds in every layer: an engine frees sliding-window
        blocks behind its window). Returns ``None`` when nothing is new, or
        when every new block is being written by another store in flight.
        Otherwise decides the medium (``memory_full`` is computed here: the arena cannot
        take the segment even after memory reclaim), reclaims the chosen medium when the
        write would cross its high watermark (actions queue up for
        ``take_reclaim_actions``), allocates, and pins the session until
        ``complete_store``. Raises ``CapacityError`` when even SSD cannot take it.

        If the middle of a prefix was reclaimed, blocks after the gap that are still
        indexed are written again; the index keeps the first copy (first writer wins).
        """
        return self._stores.prepare(session_id, keys, turn_index, context_tokens,
                                    prev_reply_tokens, shared_refcount, rows_from)

    def complete_copy(self, plan: StorePlan) -> None:
        """The data plane wrote ``plan.copy`` (the segment itself may still be in
        flight): lookups and restores may use the copy from now on."""
        self._stores.complete_copy(plan)

    def complete_store(self, plan: StorePlan, ok: bool) -> None:
        """The data plane finished writing ``plan``: publish it when ``ok`` (its bytes
        are durable), else give its allocation back. Unpins the session."""
        self._stores.complete(plan, ok)

    def fence_store(self, plan: StorePlan) -> None:
        """``plan``'s writer may still write its ranges but is no longer trusted to
        finish (its lease ended while it may only be paused): the store is never
        published (``complete_store(plan, True)`` frees it), its keys are no longer in
        flight (lookups do not wait for it, another store may write them), and its ranges
        stay allocated and its session pinned until ``complete_store`` (the writer is
        known gone, or reported the write ended) so no other store is given them."""
        self._stores.fence(plan)

    # -- load ------------------------------------------------------------------------

    def prepare_load(self, request_id: Hashable,
                     keys_or_hit: Sequence[bytes] | PrefixHit, *,
                     planner: ReadPlanner | None = None,
                     refill: bool = False) -> LoadPlan:
        """Plan a restore and pin its sessions until ``complete_load(request_id)``.

        A ``PrefixHit`` from an earlier ``lookup`` is accepted if all its segments are
        still live; otherwise ``ValueError`` (look up again). ``planner`` plans the reads
        in place of the one the books were built with (``ControlPlane(planner=...)``):
        the data path's stream planner, the replay simulator's bulk totals-only twin
        (``plan.bulk.plan_totals``); with neither, ``ValueError``. ``refill``: the data
        plane can write memory copies from restored bytes; with
        ``placement.copy_on_restore`` the plan then lists copies for the SSD segments it
        reads whole (``LoadPlan.refills``; the host names the ones it wrote in
        ``complete_load``)."""
        return self._loads.prepare(request_id, keys_or_hit, planner, refill)

    def complete_load(self, request_id: Hashable, refilled: Collection[int] = ()) -> None:
        """The restore finished (or was abandoned): unpin and touch its sessions.
        ``refilled``: home segment ids of ``LoadPlan.refills`` whose copies the data
        plane wrote (verified bytes); they serve lookups from now on, the others are
        freed."""
        self._loads.complete(request_id, refilled)

    def touch(self, session_id: str) -> None:
        """Mark a session used now (reclaim drops the least recently used first)."""
        self._sessions.session(session_id).last_access = self._clock.now()

    # -- reclaim and cuts (``reclaimer``) ----------------------------------------------

    def reclaim(self) -> list[ReclaimAction]:
        """Run reclaim for each medium over its high watermark, and return every action
        not yet taken (including those ``prepare_store`` ran)."""
        return self._reclaimer.reclaim()

    def take_reclaim_actions(self) -> list[ReclaimAction]:
        """Drain the reclaim actions done so far (the data plane deletes the files)."""
        return self._reclaimer.take_reclaim_actions()

    def take_write_backs(self) -> list[StorePlan]:
        """Drain the not-yet homes memory reclaim chose to write to the SSD rather than
        drop (``placement.not_yet_write_back`` on a host built with ``write_backs``):
        each an SSD ``StorePlan`` whose blocks the host copies from the home's arena
        range, then completes with ``complete_store`` (the home is freed once durable)."""
        return self._stores.take_write_backs()

    def drop_session(self, session_id: str) -> ReclaimAction:
        """Forget a whole session now (e.g. the engine says it ended). Refuses a pinned
        session. The returned action is not queued."""
        return self._reclaimer.drop_session(session_id)

    def truncate_session(self, session_id: str, from_segment_id: int) -> ReclaimAction:
        """Cut a session at a damaged SSD segment: unpublish it and every later segment
        of the session on either medium (so no later block sits behind the hole), give
        their space back, and keep the earlier segments served.

        The returned action (not queued) names the file to truncate (``cut_files``; a
        file left with no segment is deleted instead) and the later files to delete;
        the next ``prepare_store`` of the session appends after its last good segment.
        Raises ``KeyError`` when the segment is not a live SSD segment of the session,
        ``ValueError`` while ``tail_in_use``.
        """
        return self._reclaimer.truncate_session(session_id, from_segment_id)

    def take_window_releases(self) -> list[WindowRelease]:
        """Window rows newer turns superseded that no restore in flight reads: the
        data plane punches them out of their files before it lets go of the books
        (``control.releases``). Empty unless ``store.release_old_windows`` and the
        geometry has windows."""
        return self._releases.take(self._loads.loads) if self._releases is not None \
            else []

    def give_back_window_releases(self, releases: Iterable[WindowRelease]) -> None:
        """Releases taken by a data plane that may have stopped before punching them
        (its lease ended): the next ``take_window_releases`` hands them out again."""
        if self._releases is not None:
            self._releases.give_back(releases)

    # -- damage (``damage``) -----------------------------------------------------------

    def mark_damaged(self, segment_id: int, header_damaged: bool = False) -> bool:
        """A restore found segment ``segment_id``'s bytes wrong (and, with
        ``header_damaged``, its file's header too): stop serving it and cut its session
        before it (or before an earlier damaged segment of the same session) once
        ``settle_damage`` can. Returns ``False`` (and changes nothing) when the segment
        is no longer a published SSD segment (already cut off or reclaimed)."""
        return self._damage.mark(segment_id, header_damaged)

    def ready_cuts(self) -> list[tuple[str, Segment]]:
        """The pending cuts nothing in flight blocks (``tail_in_use`` is false), as
        ``(session_id, damaged segment)``, oldest mark first (``settle_damage`` applies
        them)."""
        return self._damage.ready_cuts(self._reclaimer)

    def settle_damage(self) -> list[ReclaimAction]:
        """Apply every pending cut nothing in flight blocks (see ``control.damage``)
        and return the actions for the data plane, followed by any reclaim actions
        queued meanwhile. A cut whose file header is damaged waits until the whole
        session is unpinned (it drops the session)."""
        if not self._cut_at and not self._actions:  # every step asks; most: nothing
            return []
        return self._damage.settle(self._reclaimer)

    # -- restart (``restart``) ---------------------------------------------------------

    def reserve_file_id(self, file_id: int) -> None:
        """A session file ``file_id`` exists on disk (served, stray or quarantined):
        the books never hand its id out for a new file."""
        self._restart.reserve_file_id(file_id)

    def recover_segment(self, session_id: str, file_id: int, file_offset: int,
                        layout: SegmentLayout, keys: Sequence[bytes], turn_index: int, *,
                        virtual_base: int | None = None,
                        last_access: float | None = None) -> Segment:
        """Restart: re-index a valid segment found by scanning a session file (see
        ``Restart.recover_segment``)."""
        return self._restart.recover_segment(session_id, file_id, file_offset, layout, keys,
                                             turn_index, virtual_base=virtual_base,
                                             last_access=last_access)

    def recover_files(self, scans: Sequence[ScannedFile], *,
                      other_file_ids: Iterable[int] = (),
                      mismatch: Literal["quarantine", "refuse"] = "quarantine") -> Recovery:
        """Re-index every valid segment of ``scans`` and decide each file's fate (see
        ``control.restart``); the data plane then acts on ``Recovery.files``. With
        window releases on, each file's turns release what they would have on publish
        (``Releases.after_recovery``; the data plane takes them as usual)."""
        rec = self._restart.recover_files(scans, other_file_ids=other_file_ids,
                                          mismatch=mismatch)
        if self._releases is not None:
            kept = {v.file_id: v.segment_ids for v in rec.files if v.segment_ids}
            self._releases.after_recovery(
                [(self.index.segment(i), s.header.first_block)
                 for i, s in zip(kept[scan.file_id], scan.segments, strict=False)]
                for scan in scans if scan.file_id in kept)
        return rec

    # -- integrity (``integrity``) ------------------------------------------------------

    def check_integrity(self) -> None:
        """Check every component and that their books agree with each other."""
        check_books(index=self.index, arena=self.arena, ssd=self.ssd,
                    scheduler=self.scheduler, copies=self.copies, sessions=self._sessions,
                    stores=self._stores, loads=self._loads, spare=self._spare,
                    damage=self._damage)
        for queue in self._queues.values():
            queue.check_integrity()
