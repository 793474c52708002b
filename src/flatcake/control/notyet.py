"""Turns placed "not yet" (``control.placement``, NOT_YET): homed in host memory until a
signal says they will be read, then written to the SSD. Books only, no I/O.

The signal is a store whose prompt runs through such a turn and goes on past it (its
session continues, or another request asks for its prefix again) and that is placed on
the SSD: ``Stores`` then starts that store's segment at the first not-yet turn the
prompt covers whole (``start``), so the data plane writes those blocks to the SSD with
the new ones, from the request's own KV. Once that segment is durable, the memory
homes it covers are freed (``settle``): their keys pass to the SSD segment (the index
keeps the later copy as a shadow until then), so nothing is served from a home that is
gone, and a restore in flight from one keeps it until its session is unpinned.

A not-yet turn dropped by memory reclaim before that is simply no longer indexed: the
next store writes its blocks with the new ones, and a hit in between is a miss. With
``placement.not_yet_write_back`` reclaim takes not-yet homes before anything else in
host memory (``homes_lru``), and writes one to the SSD from host memory while its
session may still continue (``control.stores``, a write-back: an SSD store covering the
home, freed once durable as above); it drops one unwritten only when its session has
been idle longer than ``placement.not_yet_idle_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from flatcake.control.alloc import HostArena
from flatcake.control.index import BlockIndex, HitRun, Segment
from flatcake.control.sessions import SessionTable


class NotYet:
    """The not-yet memory homes and the SSD stores that will replace them."""

    def __init__(self, index: BlockIndex, arena: HostArena, sessions: SessionTable,
                 pending: Mapping[int, object] = MappingProxyType({})) -> None:
        self._index = index
        self._arena = arena
        self._sessions = sessions
        # The stores in flight by segment id (``Stores``'): a home still being written
        # is not indexed yet, and not gone.
        self._pending = pending
        # Memory segment ids placed not yet -> their first request block, in placement
        # order.
        self._homes: dict[int, int] = {}
        self._covering: dict[int, tuple[Segment, ...]] = {}  # SSD store -> homes it writes
        self._to_free: list[Segment] = []  # covered by a durable SSD segment
        self._backs: set[int] = set()  # SSD stores in flight that are write-backs
        self.num_written = 0  # not-yet homes written to the SSD
        self.num_dropped = 0  # not-yet homes reclaim dropped unwritten (write-back on)

    def placed(self, seg: Segment, first_block: int) -> None:
        """``seg`` is a memory home placed not yet, holding request blocks from
        ``first_block``."""
        self._homes[seg.segment_id] = first_block

    def homes_lru(self) -> list[tuple[Segment, int]]:
        """The live not-yet homes no store in flight writes again, each with its first
        request block, their sessions' oldest last access first (then oldest home)."""
        covered = {s.segment_id for segs in self._covering.values() for s in segs}
        covered.update(s.segment_id for s in self._to_free)
        out: list[tuple[float, int, Segment]] = []
        for seg_id in list(self._homes):
            if seg_id in self._pending:
                continue  # its store is in flight (a host that writes later)
            seg = self._index.segment_or_none(seg_id)
            rec = self._sessions.get(seg.session_id) if seg is not None else None
            if seg is None or rec is None or seg.segment_id != seg_id:
                del self._homes[seg_id]  # reclaim or a cut dropped it with its session
            elif seg_id not in covered:
                out.append((rec.last_access, seg_id, seg))
        out.sort(key=lambda t: (t[0], t[1]))
        return [(seg, self._homes[seg.segment_id]) for _, _, seg in out]

    def writing_back_bytes(self) -> int:
        """Arena bytes of the homes whose write-back is in flight (freed once durable)."""
        return sum(seg.total_bytes for sid, segs in self._covering.items()
                   if sid in self._backs for seg in segs)

    def drop(self, seg: Segment) -> int:
        """Forget the not-yet home ``seg`` unwritten (its session pins nothing); returns
        the arena bytes freed."""
        rec = self._sessions[seg.session_id]
        self._index.remove_segment(seg.segment_id)
        freed = self._arena.free(seg.offset)
        rec.memory_bytes -= freed
        rec.remove_segments((seg,))
        del self._homes[seg.segment_id]
        self.num_dropped += 1
        return freed

    def start(self, runs: Sequence[HitRun]) -> int | None:
        """The request block where a store of a prompt hitting ``runs`` must start to
        cover the first not-yet home the hit holds whole, or ``None``."""
        for run in runs:
            seg = run.segment
            if seg.segment_id in self._homes and run.start_pos == 0 and \
                    run.num_blocks == seg.num_blocks and self._live(seg) and \
                    not self._written_back(seg.segment_id):
                return run.prefix_start
        return None

    def cover_home(self, store_id: int, seg: Segment) -> None:
        """The SSD store ``store_id`` writes the not-yet home ``seg`` back (reclaim)."""
        self._covering[store_id] = (seg,)
        self._backs.add(store_id)

    def writes_back(self, store_id: int) -> bool:
        """Whether the SSD store ``store_id`` in flight writes a home back (reclaim)."""
        return store_id in self._backs

    def cover(self, store_id: int, runs: Sequence[HitRun]) -> None:
        """The SSD store ``store_id`` writes the blocks of ``runs`` again."""
        homes = tuple(r.segment for r in runs if r.segment.segment_id in self._homes
                      and r.start_pos == 0 and r.num_blocks == r.segment.num_blocks)
        if homes:
            self._covering[store_id] = homes

    def settle(self, store_id: int, ok: bool) -> None:
        """The store ``store_id`` ended: when durable, free the homes it covers (now, or
        once no restore pins their session)."""
        homes = self._covering.pop(store_id, ())
        self._backs.discard(store_id)
        if ok:
            self._to_free.extend(homes)
        self.free_ready()

    def free_ready(self) -> None:
        """Free the covered homes whose sessions nothing pins."""
        waiting: list[Segment] = []
        for seg in self._to_free:
            if not self._live(seg):
                self._homes.pop(seg.segment_id, None)
                continue
            rec = self._sessions.get(seg.session_id)
            if rec is None or rec.num_pins:
                waiting.append(seg)
                continue
            self._index.remove_segment(seg.segment_id)
            rec.memory_bytes -= self._arena.free(seg.offset)
            rec.remove_segments((seg,))
            self._homes.pop(seg.segment_id, None)
            self._sessions.forget_if_empty(rec)
            self.num_written += 1
        self._to_free = waiting

    def _written_back(self, seg_id: int) -> bool:
        """A write-back of the home ``seg_id`` is in flight."""
        return any(len(segs) == 1 and segs[0].segment_id == seg_id and sid in self._backs
                   for sid, segs in self._covering.items())

    def _live(self, seg: Segment) -> bool:
        return self._index.segment_or_none(seg.segment_id) == seg
