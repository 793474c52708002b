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

The modules behind it: ``types`` (the plans and actions), ``books`` (state and the
query methods hosts use instead of reaching into the parts), ``reclaimer`` (reclaim,
drops, cuts at damage; the no-hole rule is stated there), ``damage`` (checksum
failures and the cuts they wait for), ``restart`` (re-indexing scanned files),
``integrity`` (the cross-check), ``spare`` (memory copies: made under the watermark,
early, on restore).

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
keys that wrote it (no holes); the host and SSD budgets are never exceeded.

Single-threaded: the owner (store, engine scheduler, simulator loop) serialises calls.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Hashable, Sequence

from flatcake.control.address import Medium, encode_address
from flatcake.control.damage import _Damage
from flatcake.control.index import PrefixHit, Segment
from flatcake.control.integrity import _Integrity
from flatcake.control.keys import check_keys
from flatcake.control.placement import PlacementSignals, decide_placement
from flatcake.control.restart import _Restart
from flatcake.control.sessions import SessionRecord, check_session_id
from flatcake.control.spare import _Spare
from flatcake.control.types import LoadPlan, StorePlan
from flatcake.errors import CapacityError
from flatcake.layout import SegmentLayout
from flatcake.readplan import ReadPlanner

logger = logging.getLogger(__name__)


class ControlPlane(_Spare, _Damage, _Restart, _Integrity):
    """Books of one node's FlatCake store (see the module docstring for the verbs).

    Attributes:
        geometry: KV geometry of the blocks stored (all segments share it).
        config: the whole configuration (placement, reclaim, planner, scheduler, store).
        clock: the time source for last access and restore waits.
        planner: the read planner ``prepare_load`` uses when its caller names none
            (``ControlPlane(..., planner=plan_reads)``; the books import no planner).
        index, arena, ssd, copies, scheduler: the parts, for the control plane's own
            modules and white-box tests; hosts use the query methods (``books``).
    """

    # -- lookup ----------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> PrefixHit:
        """The longest servable prefix of ``keys`` (published segments only, stopped
        before a segment marked damaged), with the memory copy of an SSD segment in its
        place where one is held. The copies it reports become the most recently used (a
        request is about to use them, as a tiered store's LRU refreshes the blocks a
        lookup matched)."""
        req = keys if isinstance(keys, tuple) else tuple(keys)
        hit = self.index.lookup(req)
        if len(self.copies) and hit.num_ssd_blocks:
            self.copies.touch_hit(hit)
            hit = self.copies.substitute(hit)
        if self._early:
            hit = self._with_early_copies(req, hit)
        return self._servable(hit)

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
    ) -> StorePlan | None:
        """Place and allocate the blocks of ``keys`` that are not indexed yet.

        ``shared_refcount``: live requests sharing the first block this call writes,
        or a function from that block's index in ``keys`` to the count. Only this call
        knows which block that is (another request may have stored part of the prompt
        since the request arrived), so every host passes the function: the signal is
        taken at the block that is really written, the same way everywhere.

        ``keys`` are the request's block keys (history + new prompt). The blocks after
        the hit prefix become one new segment. Returns ``None`` when nothing is new, or
        when every new block is being written by another store in flight.
        Otherwise decides the medium (``memory_full`` is computed here: the arena cannot
        take the segment even after memory reclaim), reclaims the chosen medium when the
        write would cross its high watermark (actions queue up for
        ``take_reclaim_actions``), allocates, and pins the session until
        ``complete_store``. Raises ``CapacityError`` when even SSD cannot take it.

        If the middle of a prefix was reclaimed, blocks after the gap that are still
        indexed are written again; the index keeps the first copy (first writer wins).
        """
        check_session_id(session_id)
        req = keys if isinstance(keys, tuple) else tuple(keys)
        hit = self.index.lookup(req)
        new_keys = req[hit.num_blocks:]
        now = self.clock.now()
        rec = self._sessions.get(session_id)
        if not new_keys or all(k in self._writing for k in new_keys):
            # Nothing new, or only blocks another store in flight writes (served once
            # durable; writing them twice would waste the SSD).
            if rec is not None:
                rec.last_access = now
            return None
        check_keys(new_keys, hit.num_blocks)
        shared = shared_refcount(hit.num_blocks) if callable(shared_refcount) \
            else shared_refcount
        # Validates the signal fields before anything changes.
        signals = PlacementSignals(False, shared, turn_index, context_tokens,
                                   prev_reply_tokens)
        if rec is None:
            rec = self._sessions[session_id] = SessionRecord(session_id, now)
        rec.last_access = now
        rec.num_pins += 1  # a write is in flight: reclaim must skip this session
        try:
            plan = self._place_and_allocate(rec, new_keys, hit.num_blocks, turn_index, signals)
        except BaseException:
            rec.num_pins -= 1
            self._forget_if_empty(rec)
            raise
        self._pending_stores[plan.segment.segment_id] = plan
        self._writing.update(plan.segment.keys)
        self._rules[plan.placement.rule] += 1
        return plan

    def _place_and_allocate(self, rec: SessionRecord, new_keys: tuple[bytes, ...],
                            first_block: int, turn_index: int,
                            signals: PlacementSignals) -> StorePlan:
        g = self.geometry
        n = len(new_keys)
        mem_layout = SegmentLayout.for_memory(n, g.num_layers, g.block_bytes_per_layer)
        rc = self.config.reclaim
        tentative = decide_placement(signals, self.config.placement)
        # Reclaim memory only for a write that would go there, and only if the segment
        # could fit in the arena at all (no point dropping sessions otherwise).
        if tentative.medium == Medium.MEMORY and \
                mem_layout.total_bytes <= self.arena.capacity_bytes:
            projected = self.arena.used_bytes + mem_layout.total_bytes
            if projected > rc.memory_high * self.arena.capacity_bytes or \
                    not self.arena.can_fit(mem_layout.total_bytes):
                self._reclaim_memory(projected, mem_layout.total_bytes)
        fits = self.arena.can_fit(mem_layout.total_bytes)
        signals = PlacementSignals(not fits, signals.shared_refcount, signals.turn_index,
                                   signals.context_tokens, signals.prev_reply_tokens)
        placement = decide_placement(signals, self.config.placement)
        seg_id = self._next_segment_id
        if placement.medium == Medium.MEMORY:
            offset = self.arena.alloc(mem_layout.total_bytes)
            self._next_segment_id += 1
            segment = Segment(seg_id, rec.session_id, Medium.MEMORY,
                              encode_address(Medium.MEMORY, self.node_id, offset),
                              mem_layout, new_keys, turn_index)
            rec.memory_bytes += mem_layout.total_bytes
            return StorePlan(rec.session_id, segment, placement, first_block)
        ssd_layout = SegmentLayout.for_ssd(n, g.num_layers, g.block_bytes_per_layer)
        size = ssd_layout.total_bytes
        projected = self.ssd.used_bytes + size + self.ssd.file_header_bytes
        if projected > rc.ssd_high * self.ssd.capacity_bytes:
            self._reclaim_ssd(projected)
        ext = self.ssd.try_allocate(rec.session_id, size)
        if ext is None:
            self._rejected += 1
            raise CapacityError(
                f"cannot store {n} blocks ({size} bytes) of session {rec.session_id!r}: "
                f"SSD used {self.ssd.used_bytes} of store.ssd_capacity_bytes="
                f"{self.ssd.capacity_bytes} after reclaim, host arena full"
            )
        self._next_segment_id += 1
        segment = Segment(seg_id, rec.session_id, Medium.SSD,
                          encode_address(Medium.SSD, self.node_id, ext.offset),
                          ssd_layout, new_keys, turn_index, ext.file_id, ext.file_offset)
        rec.ssd_bytes += size + (self.ssd.file_header_bytes if ext.new_file else 0)
        return StorePlan(rec.session_id, segment, placement, first_block,
                         ext.base_offset, self.ssd.span_bytes, ext.new_file,
                         self._allocate_copy(rec, segment, mem_layout))

    def complete_store(self, plan: StorePlan, ok: bool) -> None:
        """The data plane finished writing ``plan``: publish it when ``ok`` (its bytes
        are durable), else give its allocation back. Unpins the session."""
        seg = plan.segment
        if self._pending_stores.get(seg.segment_id) is not plan:
            raise KeyError(f"no store in flight for segment_id {seg.segment_id!r}")
        del self._pending_stores[seg.segment_id]
        self._writing.subtract(seg.keys)
        for key in seg.keys:
            if not self._writing[key]:
                del self._writing[key]
        rec = self._sessions[plan.session_id]
        rec.num_pins -= 1
        early = plan.copy is not None and plan.copy.segment_id in self._early_ids
        if plan.copy is not None and early:
            if self._early_ids.pop(plan.copy.segment_id):
                # It owns every entry of its keys (only its own store removes them).
                deque(map(self._early.__delitem__, plan.copy.keys), maxlen=0)
            else:
                for key in plan.copy.keys:
                    entry = self._early.get(key)
                    if entry is not None and entry[0] is plan:
                        del self._early[key]
        if ok:
            self.index.publish(seg)
            rec.segment_ids_on(seg.medium).append(seg.segment_id)
            rec.last_access = self.clock.now()
            if plan.copy is not None:
                self.copies.add(seg, plan.copy)
                rec.copy_ids.append(seg.segment_id)
                self._copy_holders.add(rec.session_id)
                self._copies_made += 1
            return
        if plan.copy is not None and early:
            # Restores may be reading the copy: it becomes the blocks' memory home.
            self.index.publish(plan.copy)
            rec.memory_segment_ids.append(plan.copy.segment_id)
            rec.memory_bytes += plan.copy.total_bytes
            rec.copy_bytes -= plan.copy.total_bytes
        elif plan.copy is not None:
            rec.copy_bytes -= self.arena.free(plan.copy.offset)
        if seg.medium == Medium.MEMORY:
            rec.memory_bytes -= self.arena.free(seg.offset)
        else:
            # Segment.__post_init__ guarantees both are set on SSD.
            file_id = int(seg.file_id or 0)
            rec.ssd_bytes -= self.ssd.free_extent(file_id, int(seg.file_offset or 0))
            if not self.ssd.file(file_id).extents:
                # Nothing in it and nothing in flight into it (a write holds an
                # extent): the file goes, so a creation that failed leaks nothing.
                rec.ssd_bytes -= self.ssd.release_file(file_id)
        self._forget_if_empty(rec)
        logger.debug("store of segment %d (session %r) failed; allocation freed",
                     seg.segment_id, plan.session_id)

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
        if request_id in self._loads:
            raise ValueError(f"request_id {request_id!r} already has a load in flight")
        planner = planner if planner is not None else self.planner
        if planner is None:
            raise ValueError("prepare_load needs a read planner: pass planner= here or to "
                             "ControlPlane (e.g. flatcake.plan.reads.plan_reads)")
        if isinstance(keys_or_hit, PrefixHit):
            hit = keys_or_hit
            published = self.index.segment_or_none
            for run in hit.runs:
                seg = run.segment
                if published(seg.segment_id) is not seg and not self._live_segment_ids(seg):
                    raise ValueError(f"stale PrefixHit: segment {seg.segment_id} was "
                                     f"reclaimed; look the keys up again")
        else:
            hit = self.lookup(keys_or_hit)
        read_plan = planner(hit.runs, self.geometry.num_layers, self.ssd.resolve,
                            self.config.planner)
        sessions = hit.session_ids
        for sid in sessions:
            self._sessions[sid].num_pins += 1
        if hit.num_memory_blocks:
            for run in hit.runs:
                if run.segment.medium is Medium.MEMORY:
                    self.copies.touch(run.segment)
                    self._copy_reads[run.segment.segment_id] += 1
        refills = self._refills(hit) if refill and self.config.placement.copy_on_restore \
            and hit.num_ssd_blocks else ()
        plan = LoadPlan(request_id, hit, read_plan, sessions, refills)
        self._loads[request_id] = plan
        return plan

    def complete_load(self, request_id: Hashable, refilled: Collection[int] = ()) -> None:
        """The restore finished (or was abandoned): unpin and touch its sessions.
        ``refilled``: home segment ids of ``LoadPlan.refills`` whose copies the data
        plane wrote (verified bytes); they serve lookups from now on, the others are
        freed."""
        plan = self._loads.pop(request_id, None)
        if plan is None:
            raise KeyError(f"request_id {request_id!r} has no load in flight")
        for home, copy in plan.refills:
            rec = self._sessions[home.session_id]
            if home.segment_id in refilled and self.index.has_segment(home.segment_id) \
                    and self.copies.get(home.segment_id) is None:
                self.copies.add(home, copy)
                rec.copy_ids.append(home.segment_id)
                self._copy_holders.add(rec.session_id)
                self._copies_made += 1
            else:
                rec.copy_bytes -= self.arena.free(copy.offset)
        now = self.clock.now()
        for sid in plan.session_ids:
            rec = self._sessions[sid]
            rec.num_pins -= 1
            rec.last_access = now
        if plan.hit.num_memory_blocks:
            reads = self._copy_reads
            for run in plan.hit.runs:
                if run.segment.medium is Medium.MEMORY:
                    reads[run.segment.segment_id] -= 1
                    if not reads[run.segment.segment_id]:
                        del reads[run.segment.segment_id]

    def touch(self, session_id: str) -> None:
        """Mark a session used now (reclaim drops the least recently used first)."""
        self.session(session_id).last_access = self.clock.now()
