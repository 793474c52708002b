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

``Damage`` owns what is known to be damaged and decides how each cut is made; the
``Reclaimer`` makes them (``Cuts``) and tells it what its cuts and drops removed
(``forget``); nothing else writes it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from flatcake.control.address import Medium
from flatcake.control.index import BlockIndex, PrefixHit, Segment
from flatcake.control.sessions import SessionTable
from flatcake.control.types import ReclaimAction
from flatcake.errors import IntegrityError

logger = logging.getLogger(__name__)


class Cuts(Protocol):
    """What settling damage asks of the reclaimer (``control.reclaimer.Reclaimer``)."""

    def tail_in_use(self, session_id: str, from_segment_id: int) -> bool: ...
    def truncate_session(self, session_id: str, from_segment_id: int) -> ReclaimAction: ...
    def drop_session(self, session_id: str) -> ReclaimAction: ...
    def take_reclaim_actions(self) -> list[ReclaimAction]: ...


class Damage:
    """SSD segments that failed a checksum and the cuts they wait for.

    Owns (written only by its methods; the facade reads the first two, so a lookup or a
    step with no damage asks nothing here): ``damaged``, the damaged segment ids still
    in the books; ``cut_at``, per session its earliest damaged segment on disk, where
    the session is to be cut (in the order the sessions were first marked); and
    ``_bad_headers``, the session files whose own header a restore found damaged (a cut
    at one of their segments drops the session and quarantines its files). Reads the
    index and the session table it is given (never writes them).
    """

    def __init__(self, index: BlockIndex, sessions: SessionTable) -> None:
        self._index = index
        self._sessions = sessions
        self.damaged: set[int] = set()
        self.cut_at: dict[str, int] = {}
        self._bad_headers: set[int] = set()

    def mark(self, segment_id: int, header_damaged: bool = False) -> bool:
        """``ControlPlane.mark_damaged``: ``False`` (nothing changes) when the segment
        is no longer a published SSD segment."""
        try:
            seg = self._index.segment(segment_id)
        except KeyError:
            return False
        if seg.medium != Medium.SSD:
            return False
        self.damaged.add(segment_id)
        if header_damaged:
            self._bad_headers.add(int(seg.file_id or 0))
        sid = seg.session_id
        first = self.cut_at.get(sid)
        if first is None or _disk_order(seg) < _disk_order(self._index.segment(first)):
            self.cut_at[sid] = segment_id
        return True

    def is_damaged(self, segment_id: int) -> bool:
        return segment_id in self.damaged

    @property
    def num_damaged(self) -> int:
        """Damaged segments still in the books (their sessions not cut yet)."""
        return len(self.damaged)

    def cut_pending(self, session_id: str) -> bool:
        return session_id in self.cut_at

    def servable(self, hit: PrefixHit) -> PrefixHit:
        """``hit`` stopped before its first run in a damaged segment."""
        if not self.damaged:
            return hit
        runs = []
        for run in hit.runs:
            if run.segment.segment_id in self.damaged:
                break
            runs.append(run)
        if len(runs) == len(hit.runs):
            return hit
        mem = sum(r.num_blocks for r in runs if r.segment.medium == Medium.MEMORY)
        ssd = sum(r.num_blocks for r in runs if r.segment.medium == Medium.SSD)
        return PrefixHit(mem + ssd, mem, ssd, tuple(runs))

    def forget(self, session_id: str, removed: Iterable[int]) -> None:
        """Segments of ``session_id`` left the books: they are damaged no more, and a
        pending cut at one of them is done."""
        self.damaged.difference_update(removed)
        if self.cut_at.get(session_id, -1) not in self.damaged:
            self.cut_at.pop(session_id, None)

    def ready_cuts(self, cuts: Cuts) -> list[tuple[str, Segment]]:
        """``ControlPlane.ready_cuts``: the pending cuts ``cuts`` can make now."""
        return [(sid, self._index.segment(seg_id)) for sid, seg_id in self.cut_at.items()
                if not cuts.tail_in_use(sid, seg_id)]

    def settle(self, cuts: Cuts) -> list[ReclaimAction]:
        """``ControlPlane.settle_damage``: every ready cut made by ``cuts`` (see the
        module docstring), then the reclaim actions queued meanwhile."""
        actions: list[ReclaimAction] = []
        for sid, seg in self.ready_cuts(cuts):
            file_id = int(seg.file_id or 0)
            if file_id not in self._bad_headers:
                actions.append(cuts.truncate_session(sid, seg.segment_id))
            elif self._sessions.session(sid).num_pins == 0:
                logger.warning("session %r: file %d has a damaged header; the session is "
                               "dropped and its files quarantined", sid, file_id)
                action = replace(cuts.drop_session(sid), quarantine=True)
                self._bad_headers.difference_update(action.file_ids)
                actions.append(action)
        actions.extend(cuts.take_reclaim_actions())
        return actions

    def check_integrity(self) -> None:
        """Every damaged segment is a live SSD segment, and every pending cut is at its
        session's earliest damaged segment on disk."""
        sessions = self._sessions
        ssd_live = {i for r in sessions.values() for i in r.ssd_segment_ids}
        if not self.damaged <= ssd_live:
            raise IntegrityError(f"damaged segments {sorted(self.damaged - ssd_live)} are "
                                 f"not live SSD segments")
        for sid, seg_id in self.cut_at.items():
            owner = sessions.get(sid)
            mine = self.damaged & set(owner.ssd_segment_ids) if owner is not None else set()
            on_disk = {i: (self._index.segment(i).file_id, self._index.segment(i).file_offset)
                       for i in mine}
            if seg_id not in mine or on_disk[seg_id] != min(on_disk.values()):
                raise IntegrityError(f"session {sid!r} waits for a cut at segment {seg_id}, "
                                     f"not its earliest damaged segment")


def _disk_order(seg: Segment) -> tuple[int, int]:
    return int(seg.file_id or 0), int(seg.file_offset or 0)
