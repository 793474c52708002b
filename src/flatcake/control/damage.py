"""Damage: SSD segments that failed a checksum, kept in the books (no I/O).

A restore that finds a segment's bytes wrong reports it (``mark_damaged``, with whether
the file's own header is damaged too: the executor checks it when the segment fails).
From then on the segment is not served (``lookup`` stops a hit before it), and its
session is to be cut before its earliest damaged segment on disk, as soon as nothing
in flight uses that tail; ``settle_damage`` decides how, the same for every host::

    restore reports segment 7 bad ─► mark_damaged(7, header) ─► lookup stops before 7
                                                               cut pending: session -> 7
    settle_damage() ─► once no restore reads 7.. and no write lands after it:
        header of 7's file sound   ─► truncate_session: 7 and later segments cut off,
                                       the file truncated, later files deleted
        header of 7's file damaged ─► once nothing at all pins the session:
                                       drop_session, its files quarantined
                                       (ReclaimAction.quarantine)
    └─► the books forget the damage of every segment the cut removed

Reclaim and drops that remove a damaged segment settle its damage the same way, so
a host never tracks damage itself. Single-threaded, like every verb.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit, Segment
from flatcake.control.reclaimer import _Reclaimer
from flatcake.control.types import ReclaimAction

logger = logging.getLogger(__name__)


class _Damage(_Reclaimer):
    """Damage marking and pending cuts for ``ControlPlane``."""

    def mark_damaged(self, segment_id: int, header_damaged: bool = False) -> bool:
        """A restore found segment ``segment_id``'s bytes wrong (and, with
        ``header_damaged``, its file's header too): stop serving it and cut its session
        before it (or before an earlier damaged segment of the same session) once
        ``settle_damage`` can. Returns ``False`` (and changes nothing) when the segment
        is no longer a published SSD segment (already cut off or reclaimed)."""
        try:
            seg = self.index.segment(segment_id)
        except KeyError:
            return False
        if seg.medium != Medium.SSD:
            return False
        self._damaged.add(segment_id)
        if header_damaged:
            self._bad_headers.add(int(seg.file_id or 0))
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

    def _servable(self, hit: PrefixHit) -> PrefixHit:
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
        ``(session_id, damaged segment)``, oldest mark first (``settle_damage`` applies
        them)."""
        return [(sid, self.index.segment(seg_id)) for sid, seg_id in self._cut_at.items()
                if not self.tail_in_use(sid, seg_id)]

    def settle_damage(self) -> list[ReclaimAction]:
        """Apply every pending cut nothing in flight blocks (see the module docstring)
        and return the actions for the data plane, followed by any reclaim actions
        queued meanwhile. A cut whose file header is damaged waits until the whole
        session is unpinned (it drops the session)."""
        actions: list[ReclaimAction] = []
        for sid, seg in self.ready_cuts():
            file_id = int(seg.file_id or 0)
            if file_id not in self._bad_headers:
                actions.append(self.truncate_session(sid, seg.segment_id))
            elif self.session(sid).num_pins == 0:
                logger.warning("session %r: file %d has a damaged header; the session is "
                               "dropped and its files quarantined", sid, file_id)
                action = replace(self.drop_session(sid), quarantine=True)
                self._bad_headers.difference_update(action.file_ids)
                actions.append(action)
        actions.extend(self.take_reclaim_actions())
        return actions


def _disk_order(seg: Segment) -> tuple[int, int]:
    return int(seg.file_id or 0), int(seg.file_offset or 0)
