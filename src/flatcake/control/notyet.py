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
next store writes its blocks with the new ones, and a hit in between is a miss.
"""

from __future__ import annotations

from collections.abc import Sequence

from flatcake.control.alloc import HostArena
from flatcake.control.index import BlockIndex, HitRun, Segment
from flatcake.control.sessions import SessionTable


class NotYet:
    """The not-yet memory homes and the SSD stores that will replace them."""

    def __init__(self, index: BlockIndex, arena: HostArena, sessions: SessionTable) -> None:
        self._index = index
        self._arena = arena
        self._sessions = sessions
        self._homes: set[int] = set()  # memory segment ids placed not yet
        self._covering: dict[int, tuple[Segment, ...]] = {}  # SSD store -> homes it writes
        self._to_free: list[Segment] = []  # covered by a durable SSD segment
        self.num_written = 0  # not-yet homes written to the SSD

    def placed(self, seg: Segment) -> None:
        """``seg`` is a memory home placed not yet."""
        self._homes.add(seg.segment_id)

    def start(self, runs: Sequence[HitRun]) -> int | None:
        """The request block where a store of a prompt hitting ``runs`` must start to
        cover the first not-yet home the hit holds whole, or ``None``."""
        for run in runs:
            seg = run.segment
            if seg.segment_id in self._homes and run.start_pos == 0 and \
                    run.num_blocks == seg.num_blocks and self._live(seg):
                return run.prefix_start
        return None

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
        if ok:
            self._to_free.extend(homes)
        self.free_ready()

    def free_ready(self) -> None:
        """Free the covered homes whose sessions nothing pins."""
        waiting: list[Segment] = []
        for seg in self._to_free:
            if not self._live(seg):
                self._homes.discard(seg.segment_id)
                continue
            rec = self._sessions.get(seg.session_id)
            if rec is None or rec.num_pins:
                waiting.append(seg)
                continue
            self._index.remove_segment(seg.segment_id)
            rec.memory_bytes -= self._arena.free(seg.offset)
            rec.memory_segment_ids.remove(seg.segment_id)
            self._homes.discard(seg.segment_id)
            self._sessions.forget_if_empty(rec)
            self.num_written += 1
        self._to_free = waiting

    def _live(self, seg: Segment) -> bool:
        return self._index.segment_or_none(seg.segment_id) == seg
