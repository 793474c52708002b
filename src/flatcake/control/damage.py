"""Damage: SSD segments that failed a checksum, kept in the books (no I/O).

A restore that finds a segment's bytes wrong reports it (``mark_damaged``). From then
on the segment is not served (``usable_hit`` stops a hit before it), and its session
is to be cut before its earliest damaged segment on disk, as soon as nothing in flight
uses that tail (``ready_cuts``)::

    restore reports segment 7 bad ─► mark_damaged(7) ─► usable_hit stops before 7
                                                       cut pending: session -> 7
    ready_cuts() ─► [(session, segment 7)] once no restore reads 7.. and no write
                    lands after it
    host: truncate_session(session, 7)   (or drop_session, e.g. when the file's own
                                           header is damaged too: an I/O question)
         └─► the books forget the damage of every segment the cut removed

Reclaim and drops that remove a damaged segment settle its damage the same way, so
a host never tracks damage itself. Single-threaded, like every verb.
"""

from __future__ import annotations

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit, Segment
from flatcake.control.reclaimer import _Reclaimer


class _Damage(_Reclaimer):
    """Damage marking and pending cuts for ``ControlPlane``."""

    def mark_damaged(self, segment_id: int) -> bool:
        """A restore found segment ``segment_id``'s bytes wrong: stop serving it and
        cut its session before it (or before an earlier damaged segment of the same
        session) once ``ready_cuts`` says so. Returns ``False`` (and changes nothing)
        when the segment is no longer a published SSD segment (already cut off or
        reclaimed)."""
        try:
            seg = self.index.segment(segment_id)
        except KeyError:
            return False
        if seg.medium != Medium.SSD:
            return False
        self._damaged.add(segment_id)
        sid = seg.session_id
        first = self._cut_at.get(sid)
        if first is None or _disk_order(seg) < _disk_order(self.index.segment(first)):
            self._cut_at[sid] = segment_id
        return True

    def is_damaged(self, segment_id: int) -> bool:
        return segment_id in self._damaged

    @property
    def num_damaged(self) -> int:
        """Damaged segments still in the books (their sessions not cut yet)."""
        return len(self._damaged)

    def cut_pending(self, session_id: str) -> bool:
        """Whether the session waits to be cut before a damaged segment (a write into
        it should wait: it would land behind the cut)."""
        return session_id in self._cut_at

    def usable_hit(self, hit: PrefixHit) -> PrefixHit:
        """``hit`` stopped before its first run in a damaged segment."""
        if not self._damaged:
            return hit
        runs = []
        for run in hit.runs:
            if run.segment.segment_id in self._damaged:
                break
            runs.append(run)
        if len(runs) == len(hit.runs):
            return hit
        mem = sum(r.num_blocks for r in runs if r.segment.medium == Medium.MEMORY)
        ssd = sum(r.num_blocks for r in runs if r.segment.medium == Medium.SSD)
        return PrefixHit(mem + ssd, mem, ssd, tuple(runs))

    def ready_cuts(self) -> list[tuple[str, Segment]]:
        """The pending cuts nothing in flight blocks (``tail_in_use`` is false), as
        ``(session_id, damaged segment)``, oldest mark first. The host applies each
        with ``truncate_session`` (or ``drop_session``); the cut stays pending until
        one of them removes the segment."""
        return [(sid, self.index.segment(seg_id)) for sid, seg_id in self._cut_at.items()
                if not self.tail_in_use(sid, seg_id)]


def _disk_order(seg: Segment) -> tuple[int, int]:
    return int(seg.file_id or 0), int(seg.file_offset or 0)
