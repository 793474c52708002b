"""The store verbs behind ``ControlPlane``: place and allocate a turn's new blocks, then
publish them once durable or give the allocation back (no I/O)::

    prepare(session, keys, signals) ─► placement (memory or SSD, reclaim first when the
                                       write would cross the medium's high watermark),
                                       an address, maybe a memory copy; session pinned;
                                       from a not-yet turn the prompt continues, when
                                       SSD-bound (``control.notyet``)
    complete_copy(plan) ─────────────► the copy serves lookups early (``EarlyCopies``)
    complete(plan, ok) ──────────────► published (ok) or freed; session unpinned;
                                       not-yet homes it covers freed
    write_back(home, first) ─────────► memory reclaim's SSD store of a not-yet home
                                       (``placement.not_yet_write_back``), handed to
                                       the host by ``take_write_backs``
    fence(plan) ─────────────────────► its writer is no longer trusted: never published,
                                       its keys no longer in flight, its ranges held
                                       (still pending) until ``complete`` frees them

Single-threaded, like every verb.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType

from flatcake.clock import Clock
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.alloc import HostArena
from flatcake.control.copies import EarlyCopies
from flatcake.control.index import BlockIndex, HitRun, Segment, head_runs
from flatcake.control.keys import check_keys
from flatcake.control.notyet import NotYet
from flatcake.control.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
)
from flatcake.control.reclaimer import Reclaimer
from flatcake.control.releases import Releases
from flatcake.control.sessions import SegmentIds, SessionRecord, SessionTable, check_session_id
from flatcake.control.spare import Spare
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.types import StorePlan
from flatcake.control.wear import Wear
from flatcake.errors import CapacityError
from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout, merge_ends

logger = logging.getLogger(__name__)
_WRITE_BACK = Placement(Medium.SSD, PlacementRule.NOT_YET)  # a not-yet home written back
MAX_LAYOUTS = 4096  # segment layouts remembered


class Stores:
    """The stores in flight, from ``prepare`` to ``complete``.

    Owns (written only here): ``pending``, the stores in flight by segment id (the
    ``Reclaimer`` reads it: nothing in flight may be cut); ``_writing``, their keys ->
    how many write each (``keys_in_flight`` is its read-only view: a lookup that stops
    at one waits for it rather than recompute it); the placements made per rule and the
    stores rejected. Writes the parts it is given: allocations in the arena and the SSD
    space, the index (publish), session records (pins, bytes, segment ids) and the table
    (new sessions), segment ids; memory copies through ``spare`` and ``EarlyCopies``;
    reclaim through ``reclaimer``.
    """

    def __init__(self, config: FlatCakeConfig, geometry: KVGeometry, clock: Clock,
                 node_id: int, index: BlockIndex, arena: HostArena, ssd: SsdSpace,
                 sessions: SessionTable, ids: SegmentIds, spare: Spare, early: EarlyCopies,
                 reclaimer: Reclaimer, pending: dict[int, StorePlan],
                 releases: Releases | None = None,
                 served: Callable[[tuple[bytes, ...]], int] | None = None,
                 wear: Wear | None = None, not_yet: NotYet | None = None) -> None:
        self._config = config
        self._geometry = geometry
        self._clock = clock
        self._node_id = node_id
        self._index = index
        self._arena = arena
        self._ssd = ssd
        self._sessions = sessions
        self._ids = ids
        self._spare = spare
        self._early = early
        self._reclaimer = reclaimer
        self._pending = pending
        self._releases = releases
        # The blocks a lookup of a prompt serves (``ControlPlane.lookup``): where a
        # stored prompt's end holds no window, a window segment is written there.
        self._served = served
        # (on SSD, blocks, ends) -> its layout: frozen, and one geometry's stores ask
        # for the same few again and again (bounded: cleared when full).
        self._layouts: dict[tuple[bool, int, tuple[tuple[int, int], ...]], SegmentLayout] = {}
        self._window_blocks = max(geometry.layer_window_blocks, default=0)
        self._wear = wear if wear is not None else Wear()
        self._not_yet = not_yet if config.placement.not_yet else None
        # SSD stores in flight -> the runs before them (what they release once durable).
        self._prefix: dict[int, tuple[HitRun, ...]] = {}
        self._writing: Counter[bytes] = Counter()
        # Whether a store in flight writes a key: every lookup asks it of the key after
        # its hit, so it is the counter's own test, no wrapper (read-only view).
        self.keys_in_flight: Mapping[bytes, int] = MappingProxyType(self._writing)
        # Pending stores whose writer may still write but is no longer trusted
        # (``fence``): their keys left ``_writing``; never published.
        self._fenced: set[int] = set()
        self._rules: Counter[PlacementRule] = Counter()
        self._rejected = 0
        # Write-backs of not-yet homes (``write_back``) the host has not taken yet
        # (``take_write_backs``); those in flight are ``NotYet``'s.
        self._backs_out: list[StorePlan] = []

    @property
    def pending(self) -> Mapping[int, StorePlan]:
        """The stores in flight by segment id (read-only)."""
        return self._pending

    def num_placed(self, rule: PlacementRule) -> int:
        """Stores placed by ``rule`` so far."""
        return self._rules[rule]

    @property
    def num_rejected(self) -> int:
        """Stores refused for lack of space so far."""
        return self._rejected

    def prepare(self, session_id: str, keys: Sequence[bytes], turn_index: int,
                context_tokens: int, prev_reply_tokens: int | None,
                shared_refcount: int | Callable[[int], int],
                rows_from: int = 0) -> StorePlan | None:
        """``ControlPlane.prepare_store``."""
        check_session_id(session_id)
        req = keys if isinstance(keys, tuple) else tuple(keys)
        hit = self._index.lookup(req)
        new_keys = req[hit.num_blocks:]
        first, prefix = hit.num_blocks, hit.runs
        branch = 0  # the segment's block where the prompt branched (0: none)
        every = False
        rule = self._config.store.window_rows
        if not new_keys and self._window_missing(req):
            # The whole prompt is stored, but no window where it ends (it ends inside
            # another turn's segment: a shared prefix, a branch, a retry). Its last
            # window's blocks are written again as a segment of their own, so a later
            # hit ending here is served (``windows.window_segment_hit``).
            first = max(0, len(req) - self._window_blocks)
        elif new_keys and self._window_blocks and rule == "every-block" and \
                first >= rows_from:
            every = True  # rows at every block: a hit may end anywhere in the segment
        elif new_keys and first and rule == "branches" and \
                max(0, first - self._window_blocks) >= rows_from and \
                self._window_missing(req[:first]):
            # The prompt branches off a stored prefix where no window is held (a shared
            # system prompt, a sub-agent, an edit): the segment starts a window before
            # the branch and keeps that window's rows too (``layout``'s ``ends``), so a
            # later hit ending at the branch is served.
            branch = min(first, self._window_blocks)
            first -= branch
        if first < hit.num_blocks:
            new_keys = req[first:]
            prefix = head_runs(hit.runs, first)
        if new_keys and self._not_yet is not None:
            # The prompt runs through a turn placed not yet and goes on: written to the
            # SSD with the new blocks when this store goes there (``control.notyet``).
            start = self._not_yet.start(hit.runs)
            if start is not None and start < first and self._goes_to_ssd(
                    shared_refcount(start) if callable(shared_refcount) else shared_refcount,
                    turn_index, context_tokens, prev_reply_tokens):
                # A branch stays where the branch is.
                branch += first - start if branch else 0
                first, new_keys, prefix = start, req[start:], head_runs(hit.runs, start)
        ends = self._row_ends(first, len(new_keys), rows_from, branch, every)
        now = self._clock.now()
        rec = self._sessions.get(session_id)
        if not new_keys or all(k in self._writing for k in new_keys):
            # Nothing new, or only blocks another store in flight writes (served once
            # durable; writing them twice would waste the SSD).
            if rec is not None:
                rec.last_access = now
            return None
        check_keys(new_keys, first)
        shared = shared_refcount(first) if callable(shared_refcount) else shared_refcount
        # Validates the signal fields before anything changes.
        signals = PlacementSignals(False, shared, turn_index, context_tokens,
                                   prev_reply_tokens)
        if rec is None:
            rec = self._sessions.create(session_id, now)
        rec.last_access = now
        rec.num_pins += 1  # a write is in flight: reclaim must skip this session
        try:
            plan = self._place_and_allocate(rec, new_keys, first, turn_index, signals, ends)
        except BaseException:
            rec.num_pins -= 1
            self._sessions.forget_if_empty(rec)
            raise
        self._pending[plan.segment.segment_id] = plan
        if self._not_yet is not None:
            if plan.placement.rule == PlacementRule.NOT_YET:
                self._not_yet.placed(plan.segment, first)
            elif plan.medium == Medium.SSD and first < hit.num_blocks:
                self._not_yet.cover(plan.segment.segment_id,
                                    [r for r in hit.runs if r.prefix_start >= first])
        if self._releases is not None and plan.medium == Medium.SSD and prefix:
            self._prefix[plan.segment.segment_id] = prefix
        self._writing.update(plan.segment.keys)
        self._rules[plan.placement.rule] += 1
        return plan

    def _goes_to_ssd(self, shared: int, turn_index: int, context_tokens: int,
                     prev_reply_tokens: int | None) -> bool:
        """Whether the rule sends a store with these signals to the SSD while memory
        has room (memory full sends it there too)."""
        signals = PlacementSignals(False, shared, turn_index, context_tokens,
                                   prev_reply_tokens)
        return decide_placement(signals, self._config.placement).medium == Medium.SSD

    def _row_ends(self, first: int, n: int, rows_from: int, branch: int, every: bool
                  ) -> tuple[tuple[int, int], ...]:
        """Where a segment of ``n`` blocks written from request block ``first`` keeps
        window rows besides its end (``layout``'s ``ends``): every block, the branch, and
        every multiple of ``store.window_row_stride_tokens`` prompt tokens (in whole
        blocks, counted from the request's first) whose window the engine still holds
        (from ``rows_from`` on)."""
        w = self._window_blocks
        if not w or not n:
            return ()
        if every:
            return ((1, n - 1),) if n > 1 else ()
        tokens = self._config.store.window_row_stride_tokens
        stride = max(1, round(tokens / self._geometry.tokens_per_block)) if tokens else 0
        lo = max(first + 1, rows_from + w)
        parts: list[tuple[tuple[int, int], ...]] = \
            [((branch, branch),)] if 0 < branch < n else []
        if stride and lo < first + n:
            end = first + n
            points: Sequence[int] = range(-(-lo // stride) * stride, end, stride)
            dense = self._config.store.window_row_stride_dense_tokens
            if dense:
                dense = max(stride, round(dense / self._geometry.tokens_per_block))
                points = [e for e in points if e % row_spacing(end - e, stride, dense) == 0]
            parts.append(tuple((e - first, e - first) for e in points))
        return merge_ends(*parts) if parts else ()

    def _window_missing(self, req: tuple[bytes, ...]) -> bool:
        """Every block of ``req`` is stored, yet a lookup of it is cut back: no window is
        held where it ends."""
        return bool(self._window_blocks and req and self._served is not None
                    and self._served(req) < len(req))

    def _layout(self, on_ssd: bool, num_blocks: int, ends: tuple[tuple[int, int], ...]
                ) -> SegmentLayout:
        key = (on_ssd, num_blocks, ends)
        got = self._layouts.get(key)
        if got is None:
            g = self._geometry
            make = SegmentLayout.for_ssd if on_ssd else SegmentLayout.for_memory
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
            got = self._layouts[key] = make(num_blocks, g.layer_block_bytes,
                                            g.layer_window_blocks, ends=ends)
        return got

    def _place_and_allocate(self, rec: SessionRecord, new_keys: tuple[bytes, ...],
                            first_block: int, turn_index: int,
                            signals: PlacementSignals,
                            ends: tuple[tuple[int, int], ...]) -> StorePlan:
        arena = self._arena
        n = len(new_keys)
        mem_layout = self._layout(False, n, ends)
        rc = self._config.reclaim
        tentative = decide_placement(signals, self._config.placement)
        # Reclaim memory only for a write that would go there, and only if the segment
        # could fit in the arena at all (no point dropping sessions otherwise).
        if tentative.medium == Medium.MEMORY and \
                mem_layout.total_bytes <= arena.capacity_bytes:
            projected = arena.used_bytes + mem_layout.total_bytes
            if projected > rc.memory_high * arena.capacity_bytes or \
                    not arena.can_fit(mem_layout.total_bytes):
                self._reclaimer.reclaim_memory(projected, mem_layout.total_bytes)
        if arena.can_fit(mem_layout.total_bytes):
            placement = tentative  # the same signals: the same decision
        else:
            signals = PlacementSignals(True, signals.shared_refcount, signals.turn_index,
                                       signals.context_tokens, signals.prev_reply_tokens)
            placement = decide_placement(signals, self._config.placement)
        if placement.medium == Medium.MEMORY:
            offset = arena.alloc(mem_layout.total_bytes)
            segment = Segment(self._ids.take(), rec.session_id, Medium.MEMORY,
                              encode_address(Medium.MEMORY, self._node_id, offset),
                              mem_layout, new_keys, turn_index)
            rec.memory_bytes += mem_layout.total_bytes
            return StorePlan(rec.session_id, segment, placement, first_block)
        return self._allocate_ssd(rec, new_keys, first_block, turn_index, placement, ends,
                                  copy=True)

    def _allocate_ssd(self, rec: SessionRecord, keys: tuple[bytes, ...], first_block: int,
                      turn_index: int, placement: Placement,
                      ends: tuple[tuple[int, int], ...], copy: bool) -> StorePlan:
        """An SSD segment for ``keys`` (SSD reclaim first when it would cross the high
        watermark), with a memory copy when ``copy`` and spare memory allow."""
        ssd = self._ssd
        n = len(keys)
        rc = self._config.reclaim
        ssd_layout = self._layout(True, n, ends)
        if ends and ssd_layout.total_bytes > ssd.span_bytes - ssd.file_header_bytes:
            # The rows at hit ends inside the turn are an option: a turn they would push
            # past one session file's span is written with its end's window only.
            ends = ()
            ssd_layout = self._layout(True, n, ends)
        size = ssd_layout.total_bytes
        projected = ssd.used_bytes + size + ssd.file_header_bytes
        if projected > rc.ssd_high * ssd.capacity_bytes:
            # Superseded window rows go first (the sessions keep every block), then
            # whole sessions (``control.releases``).
            if self._releases is not None:
                projected -= self._releases.release(
                    int(projected - rc.ssd_low * ssd.capacity_bytes))
            if projected > rc.ssd_high * ssd.capacity_bytes:
                self._reclaimer.reclaim_ssd(projected)
        new_file = ssd.opens_file(rec.session_id, size)
        if new_file and ssd.spans_in_use + 1 > rc.ssd_high * ssd.num_spans:
            self._reclaimer.reclaim_spans()
        ext = ssd.try_allocate(rec.session_id, size)
        if ext is None:
            self._rejected += 1
            if new_file and not ssd.free_spans:
                raise CapacityError(
                    f"cannot store {n} blocks of session {rec.session_id!r}: every one "
                    f"of the SSD space's {ssd.num_spans} session file spans (2**48 / "
                    f"store.session_file_bytes={ssd.span_bytes}) belongs to a session "
                    f"pinned by a restore or write in flight")
            raise CapacityError(
                f"cannot store {n} blocks ({size} bytes) of session {rec.session_id!r}: "
                f"SSD used {ssd.used_bytes} of store.ssd_capacity_bytes="
                f"{ssd.capacity_bytes} after reclaim, host arena full"
            )
        segment = Segment(self._ids.take(), rec.session_id, Medium.SSD,
                          encode_address(Medium.SSD, self._node_id, ext.offset),
                          ssd_layout, keys, turn_index, ext.file_id, ext.file_offset)
        rec.ssd_bytes += size + (ssd.file_header_bytes if ext.new_file else 0)
        spare = self._spare.allocate(rec, segment, self._layout(False, n, ends)) \
            if copy else None
        return StorePlan(rec.session_id, segment, placement, first_block,
                         ext.base_offset, ssd.span_bytes, ext.new_file, spare)

    def write_back(self, seg: Segment, first_block: int) -> bool:
        """Write the not-yet home ``seg`` (request blocks from ``first_block``) to the
        SSD from host memory: an SSD store of its blocks, pinning its session, that
        frees the home once durable (``NotYet.settle``). False when the SSD has no room
        (nothing changed)."""
        if self._not_yet is None:
            raise ValueError("write_back needs placement.not_yet")
        rec = self._sessions[seg.session_id]
        rec.num_pins += 1
        try:
            plan = self._allocate_ssd(rec, seg.keys, first_block, seg.turn_index,
                                      _WRITE_BACK, seg.layout.ends, copy=False)
        except CapacityError:
            rec.num_pins -= 1
            return False
        plan = dataclasses.replace(plan, home=seg)
        sid = plan.segment.segment_id
        self._pending[sid] = plan
        self._not_yet.cover_home(sid, seg)
        self._writing.update(plan.segment.keys)
        self._backs_out.append(plan)
        return True

    def take_write_backs(self) -> list[StorePlan]:
        """``ControlPlane.take_write_backs``: the write-backs prepared since the last
        call (the host writes each segment from its home's arena range, then completes
        it as a store)."""
        out, self._backs_out = self._backs_out, []
        return out

    def complete_copy(self, plan: StorePlan) -> None:
        """``ControlPlane.complete_copy``."""
        seg = plan.segment
        if self._pending.get(seg.segment_id) != plan or plan.copy is None or \
                seg.segment_id in self._fenced:
            raise KeyError(f"no store with a memory copy in flight for segment_id "
                           f"{seg.segment_id!r}")
        self._early.file(plan, plan.copy)

    def fence(self, plan: StorePlan) -> None:
        """``ControlPlane.fence_store``."""
        seg = plan.segment
        if self._pending.get(seg.segment_id) != plan:
            raise KeyError(f"no store in flight for segment_id {seg.segment_id!r}")
        if seg.segment_id not in self._fenced:
            self._fenced.add(seg.segment_id)
            self._unwrite(seg.keys)

    def _unwrite(self, keys: Sequence[bytes]) -> None:
        """``keys`` (a segment's: none repeats) are no longer written by one more store
        in flight. Every count popped at C speed (Counter's subtract and __delitem__ run
        in Python); the rare key another store in flight writes too is put back."""
        writing = self._writing
        counts = list(map(writing.pop, keys, repeat(0)))
        if counts.count(1) != len(counts):
            for key, count in zip(keys, counts, strict=True):
                if count != 1:
                    writing[key] = count - 1

    def complete(self, plan: StorePlan, ok: bool) -> None:
        """``ControlPlane.complete_store``; then the not-yet homes a durable SSD segment
        covers are freed (their keys pass to it)."""
        if ok and plan.segment.segment_id in self._fenced:
            logger.warning("store of segment %d (session %r) is fenced: not published, "
                           "its range freed", plan.segment.segment_id, plan.session_id)
            ok = False
        self._finish(plan, ok)
        if self._not_yet is not None:
            self._not_yet.settle(plan.segment.segment_id, ok)

    def _finish(self, plan: StorePlan, ok: bool) -> None:
        seg = plan.segment
        if self._pending.get(seg.segment_id) != plan:
            raise KeyError(f"no store in flight for segment_id {seg.segment_id!r}")
        del self._pending[seg.segment_id]
        # Asked before ``NotYet.settle`` forgets it (``complete``).
        back = self._not_yet is not None and self._not_yet.writes_back(seg.segment_id)
        prefix = self._prefix.pop(seg.segment_id, ())
        if self._fenced and seg.segment_id in self._fenced:
            self._fenced.discard(seg.segment_id)  # its keys left ``_writing`` then
        else:
            self._unwrite(seg.keys)
        rec = self._sessions[plan.session_id]
        rec.num_pins -= 1
        early = self._early.settle(plan)
        if ok:
            self._index.publish(seg)
            self._wear.wrote(seg)
            rec.add_segment(seg)
            if not back:
                rec.last_access = self._clock.now()  # a write-back is no access
            if plan.copy is not None:
                self._spare.publish(rec, seg, plan.copy)
            if prefix and self._releases is not None:
                self._releases.after_publish(seg, prefix, plan.first_block)
            return
        if plan.copy is not None and early:
            # Restores may be reading the copy: its pieces become the blocks' memory
            # homes.
            for piece in plan.copy.pieces:
                self._index.publish(piece)
                rec.add_segment(piece)
            rec.memory_bytes += plan.copy.total_bytes
            rec.copy_bytes -= plan.copy.total_bytes
        elif plan.copy is not None:
            rec.copy_bytes -= self._spare.free_pieces(plan.copy)
        if seg.medium == Medium.MEMORY:
            rec.memory_bytes -= self._arena.free(seg.offset)
        else:
            # Segment.__post_init__ guarantees both are set on SSD.
            file_id = int(seg.file_id or 0)
            rec.ssd_bytes -= self._ssd.free_extent(file_id, int(seg.file_offset or 0))
            if not self._ssd.file(file_id).extents:
                # Nothing in it and nothing in flight into it (a write holds an
                # extent): the file goes, so a creation that failed leaks nothing.
                rec.ssd_bytes -= self._ssd.release_file(file_id)
        self._sessions.forget_if_empty(rec)
        logger.debug("store of segment %d (session %r) failed; allocation freed",
                     seg.segment_id, plan.session_id)


def row_spacing(distance: int, stride: int, dense: int) -> int:
    """``store.window_row_stride_dense_tokens``: the spacing of stride rows ``distance``
    blocks before a turn's end (``stride`` and ``dense`` in blocks): the stride less
    than ``dense`` before the end, doubled there and at each doubling of the distance
    after."""
    step = stride
    while step * dense <= stride * distance:
        step *= 2
    return step
