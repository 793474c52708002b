"""Spare host memory: the memory copies of SSD-homed segments in the control plane's
books (no I/O). ``control.copies`` keeps them in LRU order; this module makes them.

* ``_allocate_copy``: a copy in the arena while memory use, the copy included, stays at
  or under ``placement.memory_copy_watermark`` (older copies make room; never a
  memory-homed segment);
* ``complete_copy`` / ``_with_early_copies``: a copy written ahead of its segment
  serves lookups before the segment is durable;
* ``_refills``: the copies a restore fills from the blocks it reads
  (``placement.copy_on_restore``).

The ``ControlPlane`` facade (``control.plane``) calls them from its store, lookup and
load verbs; single-threaded like every verb.
"""

from __future__ import annotations

from itertools import repeat

from flatcake.control.address import Medium, encode_address
from flatcake.control.index import HitRun, PrefixHit, Segment, _common_run
from flatcake.control.reclaimer import _Reclaimer
from flatcake.control.sessions import SessionRecord
from flatcake.control.types import StorePlan
from flatcake.layout import SegmentLayout


class _Spare(_Reclaimer):
    """Memory copies made under the watermark, early and on restore, for
    ``ControlPlane``."""

    def _allocate_copy(self, rec: SessionRecord, home: Segment,
                       layout: SegmentLayout) -> Segment | None:
        """A memory copy of ``home`` if memory use, the copy included, can stay at or
        under ``placement.memory_copy_watermark``: copies are a cache of the newest
        turns, so older copies (none a restore reads, least recently used first) make room,
        down to the watermark less the reclaim hysteresis (``memory_high -
        memory_low``). Never drops a memory-homed segment for a copy."""
        limit = self.config.placement.memory_copy_watermark * self.arena.capacity_bytes
        size = layout.total_bytes
        projected = self.arena.used_bytes + size
        if size > limit:
            return None
        if projected > limit:
            evictable = self.copies.total_bytes - self.copies.bytes_of(self._copy_reads)
            if projected - evictable > limit:
                return None
            rc = self.config.reclaim
            self._drop_copies(projected, size, limit * (1.0 - (rc.memory_high - rc.memory_low)))
        elif not self.arena.can_fit(size):
            self._drop_copies(projected, size, limit)
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
        # Every key, not just the first: the index may already hold the copy's first
        # blocks (another copy of them became their memory home), and the lookup
        # continues into this copy at the first key it lacks.
        early = self._early
        keys = plan.copy.keys
        # A copy's keys never repeat (prepare_store checks them): when none is taken
        # yet, one C-speed update files them all and the copy owns every entry.
        whole = early.keys().isdisjoint(keys)
        if whole:
            early.update(zip(keys, zip(repeat(plan), range(len(keys))), strict=False))
        else:
            for j, key in enumerate(keys):
                early.setdefault(key, (plan, j))
        self._early_ids[plan.copy.segment_id] = whole

    def _with_early_copies(self, req: tuple[bytes, ...], hit: PrefixHit) -> PrefixHit:
        """``hit`` continued through copies written ahead of their segments."""
        runs = list(hit.runs)
        pos, mem = hit.num_blocks, hit.num_memory_blocks
        while pos < len(req):
            entry = self._early.get(req[pos])
            if entry is None or entry[0].copy is None:
                break
            copy, j = entry[0].copy, entry[1]
            count = _common_run(req, pos, copy.keys, j)
            runs.append(HitRun(copy, j, count, pos))
            pos += count
            mem += count
            if j + count < copy.num_blocks:
                break
        if pos == hit.num_blocks:
            return hit
        return PrefixHit(pos, mem, hit.num_ssd_blocks, tuple(runs))

    def _refills(self, hit: PrefixHit) -> tuple[tuple[Segment, Segment], ...]:
        """Memory copies for the SSD segments ``hit`` reads whole, newest first (the
        ones the session's next turn needs most), while the copy watermark allows.
        Called with the hit's copies counted as read, so making room never drops them."""
        g = self.geometry
        out: list[tuple[Segment, Segment]] = []
        for run in reversed(hit.runs):
            seg = run.segment
            if seg.medium != Medium.SSD or run.start_pos or run.num_blocks != seg.num_blocks \
                    or self.copies.get(seg.segment_id) is not None:
                continue
            layout = SegmentLayout.for_memory(seg.num_blocks, g.num_layers,
                                              g.block_bytes_per_layer)
            copy = self._allocate_copy(self._sessions[seg.session_id], seg, layout)
            if copy is None:
                break
            out.append((seg, copy))
        return tuple(out)
