"""The control plane facade: keys, index, placement, allocation, reclaim, read planning
and restore scheduling behind paired lifecycle verbs. No I/O.

The same object runs inside the store (wall clock), the replay simulator (simulated
clock) and tests. The data plane executes what it plans and reports back::

    lookup(keys) ─────────────────────────────► PrefixHit
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
    recover_segment(...) ─────────────────────► restart: rebuild from scanned files

Reclaim never leaves a hole in a session's prefix. A segment's blocks follow the
blocks that were indexed when it was prepared, all in segments with smaller ids, so
the unit of reclaim is a *cut*: a session's segments from some id on, on every medium.
SSD above its high watermark: whole sessions go (the cut at the first segment).
Memory above its high watermark: first memory copies (below), then sessions are cut
at their first memory-homed segment, which frees all their memory-homed bytes and the
SSD segments written after it (their files cut there) and keeps the earlier SSD turns
served. Either way sessions go oldest last access first, never a pinned one, until
use is at or under the low watermark; nothing is ever written back or moved. A damaged
segment cuts its session the same way (``truncate_session``).

Spare memory: while host memory use (the copy included) stays at or under
``placement.memory_copy_watermark``, an SSD-homed turn also gets a *memory copy*
(``StorePlan.copy``; the data plane writes it with the segment). Restores read it in
place of the SSD (``lookup`` reports it) from ``complete_copy`` on, before the segment
is durable (its session stays pinned until then, so the copy cannot go); it is dropped
with its home and first when memory is needed; the home never changes, except that a
copy already readable when its segment's write fails becomes the blocks' memory home.

Invariants: an address is published only once its bytes are durable (``complete_store``
with ``ok=True``); a pinned session (restore reading it, or a write into it in flight)
is never reclaimed and its copies stay; a segment a restore in flight reads, or a write
in flight after it, is never cut; every indexed block of a session is reachable by the
keys that wrote it (no holes); the host and SSD budgets are never exceeded.

Single-threaded: the owner (store, engine scheduler, simulator loop) serialises calls.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.alloc import HostArena, SsdSpace
from flatcake.control.copies import MemoryCopies
from flatcake.control.index import BlockIndex, HitRun, PrefixHit, Segment, _common_run
from flatcake.control.keys import check_key
from flatcake.control.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
)
from flatcake.control.queues import RestoreRequest
from flatcake.control.reclaim import SessionUsage, choose_victims
from flatcake.control.scheduler import MasScheduler
from flatcake.control.sessions import SessionRecord, check_session_id
from flatcake.errors import CapacityError, IntegrityError
from flatcake.geometry import KVGeometry
from flatcake.plan.layout import ALIGN, KEY_BYTES, SegmentLayout
from flatcake.plan.reads import ReadPlan, plan_reads

logger = logging.getLogger(__name__)


def _check_keys(keys: tuple[bytes, ...], first_index: int) -> None:
    """Every key is 32 bytes and none repeats (checked in bulk; the slow scans only
    name the culprit). A repeated key would make a segment the index refuses, after its
    bytes were written, and on every later restart."""
    if not (set(map(type, keys)) <= {bytes} and set(map(len, keys)) <= {KEY_BYTES}):
        for i, k in enumerate(keys):
            check_key(k, f"keys[{first_index + i}]")
    if len(set(keys)) != len(keys):
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k in first:
                raise ValueError(f"keys[{first_index + i}] repeats keys[{first_index + first[k]}]"
                                 f": a request's block keys are a chain and never repeat")
            first[k] = i


@dataclass(frozen=True, slots=True)
class StorePlan:
    """What the data plane must write for one turn.

    Attributes:
        session_id: the session written.
        segment: the segment to write, address allocated, *not yet published*.
        placement: the medium and the rule that chose it.
        first_block: request block index of the segment's position 0 (the hit prefix
            length): the segment holds request blocks ``[first_block, first_block +
            segment.num_blocks)``.
        file_base_offset: SSD only: the file's base in the node's SSD virtual space.
        span_bytes: SSD only: the file's span (the file never grows past it).
        new_file: SSD only: the file is new; create it first.
        copy: SSD only: a memory copy to write too (same blocks in the memory layout at
            ``copy.offset`` in the host arena), or ``None``.
    """

    session_id: str
    segment: Segment
    placement: Placement
    first_block: int
    file_base_offset: int | None = None
    span_bytes: int | None = None
    new_file: bool = False
    copy: Segment | None = None

    @property
    def medium(self) -> Medium:
        return self.segment.medium

    @property
    def block_range(self) -> range:
        return range(self.first_block, self.first_block + self.segment.num_blocks)

    @property
    def file_id(self) -> int | None:
        return self.segment.file_id

    @property
    def file_offset(self) -> int | None:
        return self.segment.file_offset

    @property
    def arena_offset(self) -> int | None:
        """Memory only: where the segment goes in the host arena."""
        return self.segment.offset if self.segment.medium == Medium.MEMORY else None


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """A restore: the hit and its reads. Its sessions stay pinned until
    ``complete_load``.

    Attributes:
        request_id: the request restoring.
        hit: the prefix hit being restored.
        read_plan: per-layer SSD reads and arena copies.
        session_ids: sessions pinned by this restore.
    """

    request_id: Hashable
    hit: PrefixHit
    read_plan: ReadPlan
    session_ids: frozenset[str]

    @property
    def ssd_bytes(self) -> int:
        """Bytes the restore reads from SSD (gaps and alignment included)."""
        return self.read_plan.bytes_read

    def restore_request(self, arrival_time: float) -> RestoreRequest:
        """The request as FC-MAS sees it."""
        return RestoreRequest(self.request_id, arrival_time, self.read_plan.useful_bytes,
                              self.hit.needs_ssd)


@dataclass(frozen=True, slots=True)
class FileCut:
    """A session file cut by ``truncate_session``: the data plane truncates it to
    ``end_bytes`` (the end of its last segment kept), so a restart never finds the
    segments that were cut off, and the next append lands there.

    Attributes:
        file_id: the session file.
        end_bytes: its new size (a 4 KiB multiple, at least the file header).
    """

    file_id: int
    end_bytes: int


@dataclass(frozen=True, slots=True)
class ReclaimAction:
    """A session (or part of it) dropped from the books; the data plane now deletes
    ``file_ids``, truncates ``cut_files`` and may reuse the arena ranges of
    ``memory_segments``.

    Attributes:
        session_id: the session.
        medium: the medium whose watermark triggered it; ``None`` for ``drop_session``
            and ``truncate_session``.
        memory_segments: memory segments and memory copies dropped (their arena
            ranges are free).
        ssd_segments: SSD segments dropped.
        file_ids: session files to delete.
        session_dropped: the session has nothing left and is forgotten.
        cut_files: session files to truncate (``truncate_session`` only).
    """

    session_id: str
    medium: Medium | None
    memory_segments: tuple[Segment, ...]
    ssd_segments: tuple[Segment, ...]
    file_ids: tuple[int, ...]
    session_dropped: bool
    cut_files: tuple[FileCut, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return sum(s.total_bytes for s in self.memory_segments)


@dataclass(frozen=True, slots=True)
class ControlStats:
    """A snapshot for ``flatcake inspect``, metrics and the simulator."""

    memory_used_bytes: int
    memory_capacity_bytes: int
    ssd_used_bytes: int
    ssd_capacity_bytes: int
    memory_high: float
    memory_low: float
    ssd_high: float
    ssd_low: float
    num_sessions: int
    num_pinned_sessions: int
    num_memory_segments: int
    num_ssd_segments: int
    num_files: int
    num_keys: int
    stores_in_flight: int
    loads_in_flight: int
    placements_by_rule: dict[str, int]
    sessions_reclaimed_memory: int
    sessions_reclaimed_ssd: int
    stores_rejected: int
    sessions_truncated: int = 0
    num_memory_copies: int = 0
    memory_copy_bytes: int = 0
    memory_copies_made: int = 0
    memory_copies_dropped: int = 0


class ControlPlane:
    """Books of one node's FlatCake store (see the module docstring for the verbs).

    Attributes:
        geometry: KV geometry of the blocks stored (all segments share it).
        config: the whole configuration (placement, reclaim, planner, scheduler, store).
        clock: the time source for last access and restore waits.
        index: the block index.
        arena: the host-memory arena allocator.
        ssd: the node's SSD virtual space.
        scheduler: the FC-MAS scheduler, on the same clock.
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig | None = None,
                 clock: Clock | None = None, *, file_header_bytes: int = ALIGN) -> None:
        if not isinstance(geometry, KVGeometry):
            raise ValueError(f"geometry must be a KVGeometry, got {type(geometry).__name__}")
        self.geometry = geometry
        self.config = config if config is not None else FlatCakeConfig()
        self.clock: Clock = clock if clock is not None else WallClock()
        store = self.config.store
        self.node_id = store.node_id
        self.index = BlockIndex()
        self.arena = HostArena(store.memory_capacity_bytes)
        self.ssd = SsdSpace(store.node_id, store.ssd_capacity_bytes, store.session_file_bytes,
                            file_header_bytes)
        self.scheduler = MasScheduler(self.config.scheduler, self.clock)
        self._sessions: dict[str, SessionRecord] = {}
        self._pending_stores: dict[int, StorePlan] = {}
        self._loads: dict[Hashable, LoadPlan] = {}
        self._actions: list[ReclaimAction] = []
        self._rules: Counter[PlacementRule] = Counter()
        self._next_segment_id = 0
        self._reclaimed = {Medium.MEMORY: 0, Medium.SSD: 0}
        self._rejected = 0
        self._truncated = 0
        self.copies = MemoryCopies()
        self._copy_holders: set[str] = set()  # sessions with published copies
        # Copies written ahead of their segment (complete_copy): first key -> plan.
        self._early: dict[bytes, StorePlan] = {}
        self._early_ids: set[int] = set()  # their copy segment ids
        self._copies_made = 0
        self._copies_dropped = 0

    # -- queries ---------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> PrefixHit:
        """The longest indexed prefix of ``keys`` (published segments only), with the
        memory copy of an SSD segment in its place where one is held."""
        req = keys if isinstance(keys, tuple) else tuple(keys)
        hit = self.index.lookup(req)
        if len(self.copies):
            hit = self.copies.substitute(hit)
        return self._with_early_copies(req, hit) if self._early else hit

    def _with_early_copies(self, req: tuple[bytes, ...], hit: PrefixHit) -> PrefixHit:
        """``hit`` continued through copies written ahead of their segments."""
        runs = list(hit.runs)
        pos, mem = hit.num_blocks, hit.num_memory_blocks
        while pos < len(req):
            plan = self._early.get(req[pos])
            if plan is None or plan.copy is None:
                break
            copy = plan.copy
            count = _common_run(req, pos, copy.keys, 0)
            runs.append(HitRun(copy, 0, count, pos))
            pos += count
            mem += count
            if count < copy.num_blocks:
                break
        if pos == hit.num_blocks:
            return hit
        return PrefixHit(pos, mem, hit.num_ssd_blocks, tuple(runs))

    def session(self, session_id: str) -> SessionRecord:
        """The books of a session (``KeyError`` naming it when unknown)."""
        try:
            return self._sessions[session_id]
        except KeyError:
            raise KeyError(f"unknown session_id {session_id!r}") from None

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    # -- store -----------------------------------------------------------------------

    def prepare_store(
        self,
        session_id: str,
        keys: Sequence[bytes],
        *,
        turn_index: int,
        context_tokens: int,
        prev_reply_tokens: int | None = None,
        shared_refcount: int = 1,
    ) -> StorePlan | None:
        """Place and allocate the blocks of ``keys`` that are not indexed yet.

        ``keys`` are the request's block keys (history + new prompt). The blocks after
        the hit prefix become one new segment. Returns ``None`` when nothing is new.
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
        if not new_keys:
            if rec is not None:
                rec.last_access = now
            return None
        _check_keys(new_keys, hit.num_blocks)
        # Validates the signal fields before anything changes.
        signals = PlacementSignals(False, shared_refcount, turn_index, context_tokens,
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

    def _allocate_copy(self, rec: SessionRecord, home: Segment,
                       layout: SegmentLayout) -> Segment | None:
        """A memory copy of ``home`` if memory use, the copy included, can stay at or
        under ``placement.memory_copy_watermark``: copies are a cache of the newest
        turns, so older copies (unpinned sessions, oldest last access first) make room,
        down to the watermark less the reclaim hysteresis (``memory_high -
        memory_low``). Never drops a memory-homed segment for a copy."""
        limit = self.config.placement.memory_copy_watermark * self.arena.capacity_bytes
        size = layout.total_bytes
        projected = self.arena.used_bytes + size
        if size > limit:
            return None
        if projected > limit:
            evictable = sum(self._sessions[sid].copy_bytes for sid in self._copy_holders
                            if not self._sessions[sid].num_pins)
            if projected - evictable > limit:
                return None
            rc = self.config.reclaim
            self._drop_copies(projected, size, limit * (1.0 - (rc.memory_high - rc.memory_low)))
        offset = self.arena.try_alloc(size)
        if offset is None:
            return None
        rec.copy_bytes += size
        self._next_segment_id += 1
        return Segment(self._next_segment_id - 1, rec.session_id, Medium.MEMORY,
                       encode_address(Medium.MEMORY, self.node_id, offset), layout,
                       home.keys, home.turn_index)

    def complete_copy(self, plan: StorePlan) -> None:
        """The data plane wrote ``plan.copy`` (the segment itself may still be in
        flight): lookups and restores may use the copy from now on."""
        seg = plan.segment
        if self._pending_stores.get(seg.segment_id) is not plan or plan.copy is None:
            raise KeyError(f"no store with a memory copy in flight for segment_id "
                           f"{seg.segment_id!r}")
        self._early[plan.copy.keys[0]] = plan
        self._early_ids.add(plan.copy.segment_id)

    def complete_store(self, plan: StorePlan, ok: bool) -> None:
        """The data plane finished writing ``plan``: publish it when ``ok`` (its bytes
        are durable), else give its allocation back. Unpins the session."""
        seg = plan.segment
        if self._pending_stores.get(seg.segment_id) is not plan:
            raise KeyError(f"no store in flight for segment_id {seg.segment_id!r}")
        del self._pending_stores[seg.segment_id]
        rec = self._sessions[plan.session_id]
        rec.num_pins -= 1
        early = plan.copy is not None and plan.copy.segment_id in self._early_ids
        if plan.copy is not None and early:
            self._early_ids.discard(plan.copy.segment_id)
            if self._early.get(plan.copy.keys[0]) is plan:
                del self._early[plan.copy.keys[0]]
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
                     planner: Callable[..., ReadPlan] = plan_reads) -> LoadPlan:
        """Plan a restore and pin its sessions until ``complete_load(request_id)``.

        A ``PrefixHit`` from an earlier ``lookup`` is accepted if all its segments are
        still live; otherwise ``ValueError`` (look up again). ``planner`` (same
        signature as ``plan_reads``) lets the replay simulator plan with its bulk
        totals-only twin (``replay.planfast.plan_totals``)."""
        if request_id in self._loads:
            raise ValueError(f"request_id {request_id!r} already has a load in flight")
        if isinstance(keys_or_hit, PrefixHit):
            hit = keys_or_hit
            for run in hit.runs:
                seg_id = run.segment.segment_id
                if not self._live_segment_ids(run.segment):
                    raise ValueError(f"stale PrefixHit: segment {seg_id} was reclaimed; "
                                     f"look the keys up again")
        else:
            hit = self.lookup(keys_or_hit)
        read_plan = planner(hit.runs, self.geometry.num_layers, self.ssd.resolve,
                            self.config.planner)
        sessions = hit.session_ids
        for sid in sessions:
            self._sessions[sid].num_pins += 1
        plan = LoadPlan(request_id, hit, read_plan, sessions)
        self._loads[request_id] = plan
        return plan

    def _live_segment_ids(self, seg: Segment) -> tuple[int, ...]:
        if self.copies.is_live(seg) or seg.segment_id in self._early_ids:
            return (seg.segment_id,)
        try:
            return (seg.segment_id,) if self.index.segment(seg.segment_id) is seg else ()
        except KeyError:
            return ()

    def complete_load(self, request_id: Hashable) -> None:
        """The restore finished (or was abandoned): unpin and touch its sessions."""
        plan = self._loads.pop(request_id, None)
        if plan is None:
            raise KeyError(f"request_id {request_id!r} has no load in flight")
        now = self.clock.now()
        for sid in plan.session_ids:
            rec = self._sessions[sid]
            rec.num_pins -= 1
            rec.last_access = now

    def touch(self, session_id: str) -> None:
        """Mark a session used now (reclaim drops the least recently used first)."""
        self.session(session_id).last_access = self.clock.now()

    # -- reclaim ---------------------------------------------------------------------

    def reclaim(self) -> list[ReclaimAction]:
        """Run reclaim for each medium over its high watermark, and return every action
        not yet taken (including those ``prepare_store`` ran)."""
        rc = self.config.reclaim
        if self.ssd.used_bytes > rc.ssd_high * self.ssd.capacity_bytes:
            self._reclaim_ssd(self.ssd.used_bytes)
        if self.arena.used_bytes > rc.memory_high * self.arena.capacity_bytes:
            self._reclaim_memory(self.arena.used_bytes, 0)
        return self.take_reclaim_actions()

    def take_reclaim_actions(self) -> list[ReclaimAction]:
        """Drain the reclaim actions done so far (the data plane deletes the files)."""
        out, self._actions = self._actions, []
        return out

    def _victims(self, medium: Medium, used_bytes: int) -> list[SessionRecord]:
        rc = self.config.reclaim
        if medium == Medium.SSD:
            cap, high, low = self.ssd.capacity_bytes, rc.ssd_high, rc.ssd_low
        else:
            cap, high, low = self.arena.capacity_bytes, rc.memory_high, rc.memory_low
        usage = [SessionUsage(r.session_id, r.last_access, r.num_pins > 0, r.bytes_on(medium))
                 for r in self._sessions.values()]
        victims = choose_victims(usage, used_bytes, cap, high, low)
        self._reclaimed[medium] += len(victims)
        if victims:
            logger.debug("reclaiming %d sessions on %s", len(victims), medium.name)
        return [self._sessions[sid] for sid in victims]

    def _reclaim_ssd(self, used_bytes: int) -> None:
        # A session's prefix starts in its SSD files: the whole session goes.
        for rec in self._victims(Medium.SSD, used_bytes):
            self._actions.append(self._drop(rec, Medium.SSD))

    def _reclaim_memory(self, used_bytes: int, need_bytes: int) -> None:
        """Memory use would be ``used_bytes`` (a write of ``need_bytes`` included): drop
        memory copies, then cut sessions at their first memory-homed segment."""
        used_bytes -= self._drop_copies(
            used_bytes, need_bytes, self.config.reclaim.memory_low * self.arena.capacity_bytes)
        for rec in self._victims(Medium.MEMORY, used_bytes):
            self._actions.append(self._cut(rec, min(rec.memory_segment_ids), Medium.MEMORY))

    def _drop_copies(self, used_bytes: int, need_bytes: int, target: float) -> int:
        """Drop memory copies of unpinned sessions, oldest last access first, until use
        (``used_bytes`` less what is freed) is at or under ``target`` and ``need_bytes``
        fit; returns the bytes freed."""
        recs = (self._sessions[sid] for sid in self._copy_holders)
        holders = sorted((r for r in recs if not r.num_pins),
                         key=lambda r: (r.last_access, r.session_id))
        freed = 0
        for rec in holders:
            if used_bytes - freed <= target and self.arena.can_fit(need_bytes):
                break
            copies = tuple(self._free_copy(rec, home_id) for home_id in list(rec.copy_ids))
            freed += sum(c.total_bytes for c in copies)
            self._actions.append(ReclaimAction(rec.session_id, Medium.MEMORY, copies, (), (),
                                               False))
        return freed

    def _free_copy(self, rec: SessionRecord, home_id: int) -> Segment:
        copy = self.copies.pop(home_id)
        if copy is None:
            raise KeyError(f"segment {home_id} has no memory copy")
        rec.copy_ids.remove(home_id)
        if not rec.copy_ids:
            self._copy_holders.discard(rec.session_id)
        rec.copy_bytes -= self.arena.free(copy.offset)
        self._copies_dropped += 1
        return copy

    def drop_session(self, session_id: str) -> ReclaimAction:
        """Forget a whole session now (e.g. the engine says it ended). Refuses a pinned
        session. The returned action is not queued."""
        rec = self.session(session_id)
        if rec.num_pins:
            raise ValueError(f"session_id {session_id!r} is pinned by {rec.num_pins} "
                             f"restores or writes in flight")
        return self._drop(rec, None)

    def _drop(self, rec: SessionRecord, medium: Medium | None) -> ReclaimAction:
        """The whole session: every segment, copy and file."""
        first = min((*rec.memory_segment_ids, *rec.ssd_segment_ids), default=0)
        action = self._cut(rec, first, medium)
        files = tuple(self.ssd.release_session(rec.session_id))
        rec.ssd_bytes = 0
        dropped = self._forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, action.memory_segments,
                             action.ssd_segments, (*action.file_ids, *files), dropped)

    def _cut(self, rec: SessionRecord, first_id: int, medium: Medium | None) -> ReclaimAction:
        """Unpublish every segment of ``rec`` with id >= ``first_id`` on both media
        (and their copies), give the SSD tail back: the file holding the first SSD
        segment dropped is cut there (deleted when nothing is left in it) and the
        session's later files are deleted. Nothing of it may be in flight."""
        mem_ids = [i for i in rec.memory_segment_ids if i >= first_id]
        ssd_ids = sorted(i for i in rec.ssd_segment_ids if i >= first_id)
        memory: list[Segment] = []
        for seg_id in mem_ids:
            seg = self.index.remove_segment(seg_id)
            rec.memory_bytes -= self.arena.free(seg.offset)
            memory.append(seg)
        memory.extend(self._free_copy(rec, i) for i in ssd_ids if i in rec.copy_ids)
        ssd = tuple(self.index.remove_segment(i) for i in ssd_ids)
        rec.memory_segment_ids = [i for i in rec.memory_segment_ids if i < first_id]
        rec.ssd_segment_ids = [i for i in rec.ssd_segment_ids if i < first_id]
        deleted: list[int] = []
        cuts: tuple[FileCut, ...] = ()
        if ssd:
            # Live SSD segments of a session lie in file order = id order.
            file_id, file_offset = int(ssd[0].file_id or 0), int(ssd[0].file_offset or 0)
            freed = self.ssd.truncate_file(file_id, file_offset)
            if self.ssd.file(file_id).extents:
                cuts = (FileCut(file_id, self.ssd.file(file_id).end_bytes),)
            else:
                freed += self.ssd.release_file(file_id)
                deleted.append(file_id)
            for later in self.ssd.files_of(rec.session_id):
                if later > file_id:
                    freed += self.ssd.release_file(later)
                    deleted.append(later)
            rec.ssd_bytes -= freed
        gone = self._forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, tuple(memory), ssd, tuple(deleted), gone,
                             cuts)

    def _forget_if_empty(self, rec: SessionRecord) -> bool:
        if rec.num_pins == 0 and rec.num_segments == 0 and not self.ssd.files_of(
                rec.session_id):
            self._sessions.pop(rec.session_id, None)
            return True
        return False

    # -- damage ----------------------------------------------------------------------

    def _tail_segment(self, session_id: str, from_segment_id: int) -> Segment:
        rec = self.session(session_id)
        if from_segment_id not in rec.ssd_segment_ids:
            raise KeyError(f"segment_id {from_segment_id!r} is not a live SSD segment of "
                           f"session_id {session_id!r}")
        return self.index.segment(from_segment_id)

    def tail_in_use(self, session_id: str, from_segment_id: int) -> bool:
        """Whether ``truncate_session(session_id, from_segment_id)`` must wait: a
        restore in flight reads a segment it would drop (or its copy), or a write into
        the session prepared after that segment is in flight (it would land behind the
        cut). Restores of the earlier segments do not block it."""
        self._tail_segment(session_id, from_segment_id)
        for p in self._pending_stores.values():
            if p.session_id == session_id and p.segment.segment_id > from_segment_id:
                return True
        for lp in self._loads.values():
            if session_id in lp.session_ids and any(
                    run.segment.session_id == session_id
                    and self.copies.home_id(run.segment) >= from_segment_id
                    for run in lp.hit.runs):
                return True
        return False

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
        self._tail_segment(session_id, from_segment_id)
        if self.tail_in_use(session_id, from_segment_id):
            raise ValueError(f"session_id {session_id!r}: a restore or write in flight uses "
                             f"segment {from_segment_id} or a later one; retry after it")
        action = self._cut(self._sessions[session_id], from_segment_id, None)
        self._truncated += 1
        logger.debug("session %r cut at segment %d: %d segments dropped", session_id,
                     from_segment_id, len(action.memory_segments) + len(action.ssd_segments))
        return action

    # -- restart ---------------------------------------------------------------------

    def recover_segment(self, session_id: str, file_id: int, file_offset: int,
                        layout: SegmentLayout, keys: Sequence[bytes], turn_index: int, *,
                        virtual_base: int | None = None,
                        last_access: float | None = None) -> Segment:
        """Restart: re-index a valid segment found by scanning a session file.

        ``virtual_base`` (the base recorded in the file header) keeps the file at its old
        span when that span is free. ``last_access`` (e.g. the file's mtime on this
        clock) orders reclaim; default now. Segments are published at once: the scan
        has verified their checksums.
        """
        check_session_id(session_id)
        g = self.geometry
        if layout.num_layers != g.num_layers or \
                layout.block_bytes_per_layer != g.block_bytes_per_layer:
            raise ValueError(
                f"layout {layout.num_layers}x{layout.block_bytes_per_layer} B does not match "
                f"geometry {g.num_layers}x{g.block_bytes_per_layer} B"
            )
        key_tuple = tuple(keys)
        _check_keys(key_tuple, 0)
        known_file = file_id in self.ssd.files_of(session_id)
        ext = self.ssd.adopt_extent(session_id, file_id, file_offset, layout.total_bytes,
                                    virtual_base)
        segment = Segment(self._next_segment_id, session_id, Medium.SSD,
                          encode_address(Medium.SSD, self.node_id, ext.offset), layout,
                          key_tuple, turn_index, file_id, file_offset)
        self._next_segment_id += 1
        self.index.publish(segment)
        when = self.clock.now() if last_access is None else last_access
        rec = self._sessions.get(session_id)
        if rec is None:
            rec = self._sessions[session_id] = SessionRecord(session_id, when)
        rec.last_access = max(rec.last_access, when)
        rec.ssd_segment_ids.append(segment.segment_id)
        rec.ssd_bytes += ext.size_bytes + (0 if known_file else self.ssd.file_header_bytes)
        return segment

    # -- reporting -------------------------------------------------------------------

    def stats(self) -> ControlStats:
        rc = self.config.reclaim
        recs = self._sessions.values()
        return ControlStats(
            memory_used_bytes=self.arena.used_bytes,
            memory_capacity_bytes=self.arena.capacity_bytes,
            ssd_used_bytes=self.ssd.used_bytes,
            ssd_capacity_bytes=self.ssd.capacity_bytes,
            memory_high=rc.memory_high,
            memory_low=rc.memory_low,
            ssd_high=rc.ssd_high,
            ssd_low=rc.ssd_low,
            num_sessions=len(self._sessions),
            num_pinned_sessions=sum(1 for r in recs if r.num_pins),
            num_memory_segments=sum(len(r.memory_segment_ids) for r in recs),
            num_ssd_segments=sum(len(r.ssd_segment_ids) for r in recs),
            num_files=self.ssd.num_files,
            num_keys=len(self.index),
            stores_in_flight=len(self._pending_stores),
            loads_in_flight=len(self._loads),
            placements_by_rule={r.value: self._rules[r] for r in PlacementRule},
            sessions_reclaimed_memory=self._reclaimed[Medium.MEMORY],
            sessions_reclaimed_ssd=self._reclaimed[Medium.SSD],
            stores_rejected=self._rejected,
            sessions_truncated=self._truncated,
            num_memory_copies=len(self.copies),
            memory_copy_bytes=sum(r.copy_bytes for r in recs),
            memory_copies_made=self._copies_made,
            memory_copies_dropped=self._copies_dropped,
        )

    def check_integrity(self) -> None:
        """Check every component and that their books agree with each other."""
        self.index.check_integrity()
        self.arena.check_integrity()
        self.ssd.check_integrity()
        self.scheduler.check_integrity()
        self.copies.check_integrity(self.index)
        pins: Counter[str] = Counter()
        for p in self._pending_stores.values():
            pins[p.session_id] += 1
        for lp in self._loads.values():
            for sid in lp.session_ids:
                pins[sid] += 1
        owned: set[int] = set()
        mem_total = ssd_total = 0
        hdr = self.ssd.file_header_bytes
        for sid, rec in self._sessions.items():
            if rec.num_pins != pins[sid]:
                raise IntegrityError(f"session {sid!r} has {rec.num_pins} pins, books say "
                                     f"{pins[sid]}")
            mem = ssd = 0
            for medium in (Medium.MEMORY, Medium.SSD):
                for seg_id in rec.segment_ids_on(medium):
                    seg = self.index.segment(seg_id)
                    if seg.session_id != sid or seg.medium != medium:
                        raise IntegrityError(f"segment {seg_id} misfiled under {sid!r}")
                    owned.add(seg_id)
                    if medium == Medium.MEMORY:
                        mem += seg.total_bytes
                    else:
                        ssd += seg.total_bytes
            copy = 0
            for seg_id in rec.copy_ids:
                c = self.copies.get(seg_id)
                if c is None or seg_id not in rec.ssd_segment_ids or c.session_id != sid:
                    raise IntegrityError(f"session {sid!r} lists a memory copy of segment "
                                         f"{seg_id} it does not hold")
                copy += c.total_bytes
            for p in self._pending_stores.values():
                if p.session_id == sid:
                    if p.medium == Medium.MEMORY:
                        mem += p.segment.total_bytes
                    else:
                        ssd += p.segment.total_bytes
                    if p.copy is not None:
                        copy += p.copy.total_bytes
            ssd += hdr * len(self.ssd.files_of(sid))
            if (mem, ssd, copy) != (rec.memory_bytes, rec.ssd_bytes, rec.copy_bytes):
                raise IntegrityError(f"session {sid!r} bytes ({rec.memory_bytes}, "
                                     f"{rec.ssd_bytes}, {rec.copy_bytes}) != segments "
                                     f"({mem}, {ssd}, {copy})")
            mem_total += mem + copy
            ssd_total += ssd
        if owned != {s.segment_id for s in self.index.segments()}:
            raise IntegrityError("index holds segments no session owns")
        if sum(len(r.copy_ids) for r in self._sessions.values()) != len(self.copies) or \
                self._copy_holders != {sid for sid, r in self._sessions.items() if r.copy_ids}:
            raise IntegrityError("memory copies no session owns")
        if mem_total != self.arena.used_bytes or ssd_total != self.ssd.used_bytes:
            raise IntegrityError(f"budgets ({self.arena.used_bytes}, {self.ssd.used_bytes}) "
                                 f"!= session books ({mem_total}, {ssd_total})")
        for lp in self._loads.values():
            for run in lp.hit.runs:
                if not self._live_segment_ids(run.segment):
                    raise IntegrityError(f"load {lp.request_id!r} reads dead segment "
                                         f"{run.segment.segment_id}")
        if self.arena.used_bytes > self.arena.capacity_bytes:
            raise IntegrityError("host arena over budget")
