"""Spare host memory: the memory copies of SSD-homed segments in the control plane's
books (no I/O). ``control.copies`` keeps the published ones in LRU order; ``Spare``
makes, publishes, reads and drops them:

* ``allocate``: a copy in the arena while memory use, the copy included, stays at or
  under ``placement.memory_copy_watermark`` (older copies make room; never a
  memory-homed segment);
* ``refills``: the copies a restore fills from the blocks it reads
  (``placement.copy_on_restore``), published by ``finish_refills``;
* ``start_reads`` / ``end_reads``: the memory segments loads in flight read (a copy is
  dropped only when no load reads it);
* ``drop_copies``: least recently used first, or the cheapest run of copies that opens
  an extent (the reclaimer's first step, and room for a new copy).

Copies written ahead of their segment are ``control.early``'s. Single-threaded like every
verb.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Set

from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.alloc import HostArena
from flatcake.control.copies import MemoryCopies
from flatcake.control.index import BlockIndex, PrefixHit, Segment
from flatcake.control.sessions import SegmentIds, SessionRecord, SessionTable
from flatcake.control.types import ReclaimAction
from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout


class Spare:
    """Memory copies made under the watermark and on restore, read and dropped.

    Owns (written only here): ``_reads``, memory segments (copies among them) that loads
    in flight read -> how many; ``_holders``, the sessions with published copies; the
    counts of copies made and dropped. Writes the parts it is given: ``copies`` (publish,
    drop), the arena ranges of copies, the ``copy_ids`` / ``copy_bytes`` of session
    records, segment ids drawn for copies, and the reclaim actions of the copies it drops
    (appended to ``actions``, the queue the ``Reclaimer`` drains). Reads the index.
    """

    def __init__(self, config: FlatCakeConfig, geometry: KVGeometry, node_id: int,
                 index: BlockIndex, arena: HostArena, copies: MemoryCopies,
                 sessions: SessionTable, ids: SegmentIds,
                 actions: list[ReclaimAction]) -> None:
        self._config = config
        self._geometry = geometry
        self._node_id = node_id
        self._index = index
        self._arena = arena
        self._copies = copies
        self._sessions = sessions
        self._ids = ids
        self._actions = actions
        self._reads: Counter[int] = Counter()
        self._holders: set[str] = set()
        self._made = 0
        self._dropped = 0

    # -- what it counts (stats, integrity) -------------------------------------------

    @property
    def reads(self) -> Mapping[int, int]:
        """Memory segment id -> loads in flight reading it (read-only)."""
        return self._reads

    @property
    def holders(self) -> Set[str]:
        """Sessions with published copies (read-only)."""
        return self._holders

    @property
    def num_made(self) -> int:
        return self._made

    @property
    def num_dropped(self) -> int:
        return self._dropped

    # -- making copies ---------------------------------------------------------------

    def allocate(self, rec: SessionRecord, home: Segment,
                 layout: SegmentLayout) -> Segment | None:
        """A memory copy of ``home`` if memory use, the copy included, can stay at or
        under ``placement.memory_copy_watermark``: copies are a cache of the newest
        turns, so older copies (none a restore reads, least recently used first) make room,
        down to the watermark less the reclaim hysteresis (``memory_high -
        memory_low``). Never drops a memory-homed segment for a copy."""
        arena = self._arena
        limit = self._config.placement.memory_copy_watermark * arena.capacity_bytes
        size = layout.total_bytes
        projected = arena.used_bytes + size
        if size > limit:
            return None
        if projected > limit:
            evictable = self._copies.total_bytes - self._copies.bytes_of(self._reads)
            if projected - evictable > limit:
                return None
            rc = self._config.reclaim
            self.drop_copies(projected, size, limit * (1.0 - (rc.memory_high - rc.memory_low)))
        elif not arena.can_fit(size):
            self.drop_copies(projected, size, limit)
        offset = arena.try_alloc(size)
        if offset is None:
            return None
        rec.copy_bytes += size
        return Segment(self._ids.take(), rec.session_id, Medium.MEMORY,
                       encode_address(Medium.MEMORY, self._node_id, offset), layout,
                       home.keys, home.turn_index)

    def publish(self, rec: SessionRecord, home: Segment, copy: Segment) -> None:
        """``copy`` of ``home`` is written and serves lookups from now on."""
        self._copies.add(home, copy)
        rec.copy_ids.append(home.segment_id)
        self._holders.add(rec.session_id)
        self._made += 1

    def refills(self, hit: PrefixHit) -> tuple[tuple[Segment, Segment], ...]:
        """Memory copies for the SSD segments ``hit`` reads whole, newest first (the
        ones the session's next turn needs most), while the copy watermark allows.
        Called with the hit's copies counted as read, so making room never drops them."""
        g = self._geometry
        out: list[tuple[Segment, Segment]] = []
        for run in reversed(hit.runs):
            seg = run.segment
            if seg.medium != Medium.SSD or run.start_pos or run.num_blocks != seg.num_blocks \
                    or self._copies.get(seg.segment_id) is not None:
                continue
            layout = SegmentLayout.for_memory(seg.num_blocks, g.layer_block_bytes,
                                              g.layer_window_blocks)
            if seg.layout.released:  # rows the restore does not read: none to copy
                layout = layout.release(seg.layout.released)
            copy = self.allocate(self._sessions[seg.session_id], seg, layout)
            if copy is None:
                break
            out.append((seg, copy))
        return tuple(out)

    def finish_refills(self, refills: tuple[tuple[Segment, Segment], ...],
                       refilled: Collection[int]) -> None:
        """A restore's refills: those the data plane wrote (home ids in ``refilled``)
        serve lookups from now on while their home does, the others are freed."""
        for home, copy in refills:
            rec = self._sessions[home.session_id]
            if home.segment_id in refilled and self._index.has_segment(home.segment_id) \
                    and self._copies.get(home.segment_id) is None:
                self.publish(rec, home, copy)
            else:
                rec.copy_bytes -= self._arena.free(copy.offset)

    # -- reads by loads in flight ----------------------------------------------------

    def start_reads(self, hit: PrefixHit) -> None:
        """A load of ``hit`` is planned: its memory segments are read (copies among
        them become the most recently used)."""
        if hit.num_memory_blocks:
            for run in hit.runs:
                if run.segment.medium is Medium.MEMORY:
                    self._copies.touch(run.segment)
                    self._reads[run.segment.segment_id] += 1

    def end_reads(self, hit: PrefixHit) -> None:
        """The load of ``hit`` is done: its memory segments are no longer read by it."""
        if hit.num_memory_blocks:
            reads = self._reads
            for run in hit.runs:
                if run.segment.medium is Medium.MEMORY:
                    reads[run.segment.segment_id] -= 1
                    if not reads[run.segment.segment_id]:
                        del reads[run.segment.segment_id]

    # -- dropping copies -------------------------------------------------------------

    def drop_copies(self, used_bytes: int, need_bytes: int, target: float) -> int:
        """Drop memory copies no restore reads, least recently used first, until use
        (``used_bytes`` less what is freed) is at or under ``target``; then, if
        ``need_bytes`` still do not fit in one extent, the copies in the way: those in
        the cheapest run of free space and droppable copies that spans it
        (``HostArena.cheapest_window``), each copy priced at its bytes times its rank in
        LRU order (1 for the least recently used, n for the most): fragmentation drops
        few bytes of old copies rather than a copy just made or used, as close to LRU
        as one extent allows. With no such run no more copies go (dropping them could
        not make room). Queues one action per session; returns the bytes freed."""
        freed = 0
        dropped: dict[str, list[Segment]] = {}
        copies, arena = self._copies, self._arena
        for home_id in copies.homes_lru():
            if used_bytes - freed <= target:
                break
            freed += self._drop_copy(home_id, dropped)
        if need_bytes and not arena.can_fit(need_bytes):
            movable = {c.offset: h for h, c in ((h, copies.get(h)) for h in copies.homes_lru())
                       if c is not None and c.segment_id not in self._reads}
            # Least recently used first, so a copy's rank is its recency.
            prices = {offset: arena.size_of(offset) * rank
                      for rank, offset in enumerate(movable, start=1)}
            for offset in arena.cheapest_window(need_bytes, prices) or ():
                freed += self._drop_copy(movable[offset], dropped)
        for sid, segs in dropped.items():
            self._actions.append(ReclaimAction(sid, Medium.MEMORY, tuple(segs), (), (),
                                               False))
        return freed

    def _drop_copy(self, home_id: int, dropped: dict[str, list[Segment]]) -> int:
        """Drop the copy of ``home_id`` unless a load in flight reads it; returns the
        bytes freed and files the copy under its session in ``dropped``."""
        copy = self._copies.get(home_id)
        if copy is None or copy.segment_id in self._reads:
            return 0
        rec = self._sessions[copy.session_id]
        self.free(rec, home_id)
        dropped.setdefault(rec.session_id, []).append(copy)
        return copy.total_bytes

    def free(self, rec: SessionRecord, home_id: int) -> Segment:
        """Unpublish the copy of ``home_id`` (of session ``rec``) and free its range."""
        copy = self._copies.pop(home_id)
        if copy is None:
            raise KeyError(f"segment {home_id} has no memory copy")
        rec.copy_ids.remove(home_id)
        if not rec.copy_ids:
            self._holders.discard(rec.session_id)
        rec.copy_bytes -= self._arena.free(copy.offset)
        self._dropped += 1
        return copy
