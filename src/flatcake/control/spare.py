"""Spare host memory: the memory copies of SSD-homed segments in the control plane's
books (no I/O). ``control.copies`` keeps the published ones in LRU order; ``Spare``
makes, publishes, reads and drops them:

* ``allocate``: a copy in the arena while memory use, the copy included, stays at or
  under ``placement.memory_copy_watermark`` (the least recently used copies make just
  enough room; never a memory-homed segment); a copy that no free extent takes whole
  is split over several (``copies.ArenaCopy``), so fragmentation costs no copy;
* ``refills``: the copies a restore fills from the blocks it reads
  (``placement.copy_on_restore``), published by ``finish_refills``;
* ``start_reads`` / ``end_reads``: the memory segments loads in flight read (a copy is
  dropped only when no load reads it);
* ``drop_copies``: least recently used first, or the cheapest run of copies that opens
  an extent (the reclaimer's first step, and room for a copy that needs one extent).

Copies written ahead of their segment are ``control.copies.EarlyCopies``'. Single-threaded
like every verb.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Set

from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.alloc import HostArena
from flatcake.control.copies import ArenaCopy, MemoryCopies
from flatcake.control.index import BlockIndex, PrefixHit, Segment
from flatcake.control.sessions import SegmentIds, SessionRecord, SessionTable
from flatcake.control.types import ReclaimAction
from flatcake.control.windows import restore_view
from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout

# A copy split over more extents than this is refused: every piece is one more run (a
# host-to-GPU copy) for the restores that read it, and the arena is not that scattered
# unless it is nearly full of small copies, which the watermark drop thins first.
MAX_COPY_PIECES = 16


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
                 layout: SegmentLayout) -> ArenaCopy | None:
        """A memory copy of ``home`` if memory use, the copy included, can stay at or
        under ``placement.memory_copy_watermark``: copies are a cache of the newest
        turns, so older copies (none a restore reads, least recently used first) make
        room, just enough of them, as an LRU evicts (dropping a clean copy is free, and
        each one dropped early is a restore from SSD that memory could have served).
        Never drops a memory-homed segment for a copy.

        The copy takes one extent when one fits it, else it is split over the largest
        free extents (``_place``): only a windowed layout (whose rows depend on where
        the segment ends) needs one extent, and only then are copies dropped to open
        one."""
        arena = self._arena
        limit = self._config.placement.memory_copy_watermark * arena.capacity_bytes
        size = layout.total_bytes
        projected = arena.used_bytes + size
        if size > limit:
            return None
        # A windowed layout cannot be split (see ``_split``): it needs one extent.
        need = size if layout.is_windowed else 0
        if projected > limit:
            evictable = self._copies.total_bytes - self._copies.bytes_of(self._reads)
            if projected - evictable > limit:
                return None
            self.drop_copies(projected, need, limit)
        elif need and not arena.can_fit(size):
            self.drop_copies(projected, need, limit)
        pieces = self._place(rec, home, layout, bool(need))
        if pieces is None:
            return None
        copy = ArenaCopy(home.segment_id, pieces)
        rec.copy_bytes += copy.total_bytes
        return copy

    def _place(self, rec: SessionRecord, home: Segment, layout: SegmentLayout,
               one_extent: bool) -> tuple[Segment, ...] | None:
        """The pieces of the copy of ``home`` in the arena: one extent when one takes
        it (or ``one_extent`` must), else split over several (``_split``). When the
        free extents are too scattered for that (more than ``MAX_COPY_PIECES``, or
        slivers under a block), the least recently used copies no restore reads go one
        by one until it fits (each frees its extents, joining holes): LRU order, as a
        cache evicts, instead of the copies in the way of one extent. ``None`` when
        even that cannot make room (or ``one_extent`` and no extent takes it)."""
        arena, size = self._arena, layout.total_bytes
        while True:
            offset = arena.try_alloc(size)
            if offset is not None:
                return (self._piece(rec, home, 0, home.num_blocks, layout, offset),)
            split = None if one_extent else self._split(rec, home)
            if split is not None:
                return split
            # Drop the next least recently used copy (used down by one byte).
            if one_extent or not self.drop_copies(arena.used_bytes, 0, arena.used_bytes - 1):
                return None

    def _piece(self, rec: SessionRecord, home: Segment, start: int, count: int,
               layout: SegmentLayout, offset: int) -> Segment:
        """The piece of the copy of ``home`` holding its blocks ``[start, start +
        count)`` at arena ``offset``."""
        return Segment(self._ids.take(), rec.session_id, Medium.MEMORY,
                       encode_address(Medium.MEMORY, self._node_id, offset), layout,
                       home.keys[start:start + count], home.turn_index)

    def _split(self, rec: SessionRecord, home: Segment) -> tuple[Segment, ...] | None:
        """The copy of ``home`` (an unwindowed memory layout) over several free
        extents, largest first so it has few pieces, or ``None`` (nothing allocated)
        when they cannot hold it in ``MAX_COPY_PIECES``. Every piece is a whole memory
        segment of its blocks: layer-major, so a run of blocks is one piece with its own
        layout whatever the others hold."""
        g, arena = self._geometry, self._arena
        block_bytes = sum(g.layer_block_bytes)
        placed: list[tuple[int, int, SegmentLayout, int]] = []
        start, n = 0, home.num_blocks
        while start < n and len(placed) < MAX_COPY_PIECES:
            count = min(n - start, arena.largest_free_bytes // block_bytes)
            lay = SegmentLayout.for_memory(count, g.layer_block_bytes) if count else None
            while lay is not None and not arena.can_fit(lay.total_bytes):
                count -= 1  # the extent's alignment left less than count blocks
                lay = SegmentLayout.for_memory(count, g.layer_block_bytes) if count else None
            if lay is None:
                break
            # Best fit: the last piece goes into the smallest extent that takes it.
            offset = arena.alloc(lay.total_bytes)
            placed.append((start, count, lay, offset))
            start += count
        if start < n:
            for _s, _c, _lay, offset in placed:
                arena.free(offset)
            return None
        return tuple(self._piece(rec, home, s, c, lay, offset) for s, c, lay, offset in placed)

    def publish(self, rec: SessionRecord, home: Segment, copy: ArenaCopy) -> None:
        """``copy`` of ``home`` is written and serves lookups from now on."""
        self._copies.add(home, copy)
        rec.copy_ids.append(home.segment_id)
        self._holders.add(rec.session_id)
        self._made += 1

    def refills(self, hit: PrefixHit) -> tuple[tuple[Segment, ArenaCopy], ...]:
        """Memory copies for the SSD segments ``hit`` reads whole, newest first (the
        ones the session's next turn needs most), while the copy watermark allows.
        Called with the hit's copies counted as read, so making room never drops them."""
        g = self._geometry
        out: list[tuple[Segment, ArenaCopy]] = []
        # The restore reads what the view keeps: a run wholly before the window at the
        # hit's end has its window rows left out (``windows.restore_view``), so its copy
        # claims none of them (the slots it would copy them from were never loaded).
        views = restore_view(hit.runs)
        for run, view in zip(reversed(hit.runs), reversed(views), strict=True):
            seg = run.segment
            # A segment written at a branch holds window rows a restore does not read
            # (it reads the window at the hit's end only): not copied from a restore.
            if seg.medium != Medium.SSD or run.start_pos or run.num_blocks != seg.num_blocks \
                    or seg.layout.ends or self._copies.get(seg.segment_id) is not None:
                continue
            layout = SegmentLayout.for_memory(seg.num_blocks, g.layer_block_bytes,
                                              g.layer_window_blocks)
            if view.segment.layout.released:  # rows the restore does not read: none
                layout = layout.release(view.segment.layout.released)
            copy = self.allocate(self._sessions[seg.session_id], seg, layout)
            if copy is None:
                break
            out.append((seg, copy))
        return tuple(out)

    def finish_refills(self, refills: tuple[tuple[Segment, ArenaCopy], ...],
                       refilled: Collection[int]) -> None:
        """A restore's refills: those the data plane wrote (home ids in ``refilled``)
        serve lookups from now on while their home does, the others are freed."""
        for home, copy in refills:
            rec = self._sessions[home.session_id]
            if home.segment_id in refilled and self._index.has_segment(home.segment_id) \
                    and self._copies.get(home.segment_id) is None:
                self.publish(rec, home, copy)
            else:
                rec.copy_bytes -= self.free_pieces(copy)

    # -- reads by loads in flight ----------------------------------------------------

    def start_reads(self, hit: PrefixHit) -> None:
        """A load of ``hit`` (with memory blocks: the caller asks only then) is
        planned: its memory segments are read (copies among them become the most
        recently used)."""
        for run in hit.runs:
            if run.segment.medium is Medium.MEMORY:
                self._copies.touch(run.segment)
                self._reads[run.segment.segment_id] += 1

    def end_reads(self, hit: PrefixHit) -> None:
        """The load of ``hit`` (with memory blocks) is done: its memory segments are no
        longer read by it."""
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
            # Every piece of a copy no restore reads; dropping one drops its copy (the
            # other pieces free room elsewhere too).
            movable: dict[int, int] = {}
            rank_of: dict[int, int] = {}
            for rank, h in enumerate(copies.homes_lru(), start=1):
                c = copies.get(h)
                if c is None or not self._reads.keys().isdisjoint(c.segment_ids):
                    continue
                for piece in c.pieces:
                    movable[piece.offset] = h
                    rank_of[piece.offset] = rank
            # Least recently used first, so a copy's rank is its recency.
            prices = {offset: arena.size_of(offset) * rank_of[offset] for offset in movable}
            for offset in arena.cheapest_window(need_bytes, prices) or ():
                freed += self._drop_copy(movable[offset], dropped)
        for sid, segs in dropped.items():
            self._actions.append(ReclaimAction(sid, Medium.MEMORY, tuple(segs), (), (),
                                               False))
        return freed

    def _drop_copy(self, home_id: int, dropped: dict[str, list[Segment]]) -> int:
        """Drop the copy of ``home_id`` unless a load in flight reads it; returns the
        bytes freed and files its pieces under its session in ``dropped``."""
        copy = self._copies.get(home_id)
        if copy is None or not self._reads.keys().isdisjoint(copy.segment_ids):
            return 0
        rec = self._sessions[copy.session_id]
        self.free(rec, home_id)
        dropped.setdefault(rec.session_id, []).extend(copy.pieces)
        return copy.total_bytes

    def free(self, rec: SessionRecord, home_id: int) -> ArenaCopy:
        """Unpublish the copy of ``home_id`` (of session ``rec``) and free its ranges."""
        copy = self._copies.pop(home_id)
        if copy is None:
            raise KeyError(f"segment {home_id} has no memory copy")
        rec.copy_ids.remove(home_id)
        if not rec.copy_ids:
            self._holders.discard(rec.session_id)
        rec.copy_bytes -= self.free_pieces(copy)
        self._dropped += 1
        return copy

    def free_pieces(self, copy: ArenaCopy) -> int:
        """Free the arena ranges of ``copy`` (not published, or just unpublished);
        returns the bytes freed."""
        return sum(self._arena.free(piece.offset) for piece in copy.pieces)
