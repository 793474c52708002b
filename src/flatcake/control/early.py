"""Memory copies written ahead of their segment (no I/O).

The data plane writes a turn's memory copy with its segment; once the copy is written
(``complete_copy``) lookups and restores may read it, before the segment is durable::

    prepare_store ─► StorePlan.copy allocated (``spare``)
    complete_copy ─► EarlyCopies.file: every key of the copy -> (plan, position)
                     lookup continues a hit through them (``extend``), piece by
                     piece for a copy split over several extents
    complete_store ─► EarlyCopies.settle: the keys leave; published, the copy serves as
                      a published copy (``copies``) or, when the write failed, as the
                      blocks' memory home

The session stays pinned from ``prepare_store`` to ``complete_store``, so an early copy
is never reclaimed. Single-threaded, like every verb.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from flatcake.control.copies import ArenaCopy
from flatcake.control.index import HitRun, PrefixHit, _common_run
from flatcake.control.types import StorePlan


class EarlyCopies:
    """The copies written ahead of their segments, by key.

    Owns (written only by its methods, called from the store verbs): ``_early``, key ->
    (the store in flight whose memory copy holds it, its position in that copy);
    ``_ids``, their home segment ids -> whether the copy owns every entry of its keys;
    and ``_pieces``, the segment ids of those copies' pieces.
    """

    def __init__(self) -> None:
        self._early: dict[bytes, tuple[StorePlan, int]] = {}
        self._ids: dict[int, bool] = {}
        self._pieces: set[int] = set()

    def holds(self, piece_segment_id: int) -> bool:
        """Whether the copy piece ``piece_segment_id`` serves early (written, segment
        in flight)."""
        return piece_segment_id in self._pieces

    def file(self, plan: StorePlan, copy: ArenaCopy) -> None:
        """``copy`` (``plan.copy``) is written: lookups may use it from now on."""
        # Every key, not just the first: the index may already hold the copy's first
        # blocks (another copy of them became their memory home), and the lookup
        # continues into this copy at the first key it lacks.
        early = self._early
        keys = copy.keys
        # A copy's keys never repeat (prepare_store checks them): when none is taken
        # yet, one C-speed update files them all and the copy owns every entry.
        whole = early.keys().isdisjoint(keys)
        if whole:
            early.update(zip(keys, zip(repeat(plan), range(len(keys))), strict=False))
        else:
            for j, key in enumerate(keys):
                early.setdefault(key, (plan, j))
        self._ids[copy.home_id] = whole
        self._pieces.update(copy.segment_ids)

    def settle(self, plan: StorePlan) -> bool:
        """``plan``'s store completed: its keys leave. Returns whether its copy was
        written early (restores may be reading it)."""
        copy = plan.copy
        if copy is None or copy.home_id not in self._ids:
            return False
        self._pieces.difference_update(copy.segment_ids)
        if self._ids.pop(copy.home_id):
            # It owns every entry of its keys (only its own store removes them).
            deque(map(self._early.__delitem__, copy.keys), maxlen=0)
        else:
            for key in copy.keys:
                entry = self._early.get(key)
                if entry is not None and entry[0].segment.segment_id == plan.segment.segment_id:
                    del self._early[key]
        return True

    def extend(self, req: tuple[bytes, ...], hit: PrefixHit) -> PrefixHit:
        """``hit`` continued through copies written ahead of their segments."""
        if not self._early:
            return hit
        runs = list(hit.runs)
        pos, mem = hit.num_blocks, hit.num_memory_blocks
        while pos < len(req):
            entry = self._early.get(req[pos])
            if entry is None or entry[0].copy is None:
                break
            copy, j = entry[0].copy, entry[1]
            # The piece holding position j; the next key, if it follows on, is filed
            # under the next piece (or another copy).
            piece, start = copy.piece_at(j) if len(copy.pieces) > 1 else (copy.pieces[0], 0)
            count = _common_run(req, pos, piece.keys, j - start)
            runs.append(HitRun(piece, j - start, count, pos))
            pos += count
            mem += count
            if j - start + count < piece.num_blocks:
                break
        if pos == hit.num_blocks:
            return hit
        return PrefixHit(pos, mem, hit.num_ssd_blocks, tuple(runs))
