"""Reclaim and cuts: the control plane's verbs that drop books (no I/O).

Reclaim never leaves a hole in a session's prefix. A segment's blocks follow the
blocks that were indexed when it was prepared, all in segments with smaller ids, so
the unit of reclaim is a *cut*: a session's segments from some id on, on every medium.
SSD above its high watermark: whole sessions go (the cut at the first segment).
Memory above its high watermark: first memory copies, then sessions are cut at their
first memory-homed segment, which frees all their memory-homed bytes and the SSD
segments written after it (their files cut there) and keeps the earlier SSD turns
served. Either way sessions go oldest last access first, never a pinned one, until
use is at or under the low watermark; nothing is ever written back or moved. A damaged
segment cuts its session the same way (``truncate_session``); ``drop_session`` forgets
a whole session on the engine's word.

Every verb returns (or queues, for ``take_reclaim_actions``) ``ReclaimAction`` values:
the files the data plane deletes or cuts and the arena ranges it may reuse.
"""

from __future__ import annotations

import logging

from flatcake.control.address import Medium
from flatcake.control.books import _Books
from flatcake.control.index import Segment
from flatcake.control.reclaim import SessionUsage, choose_victims
from flatcake.control.sessions import SessionRecord
from flatcake.control.types import FileCut, ReclaimAction

logger = logging.getLogger(__name__)


class _Reclaimer(_Books):
    """Reclaim by watermark, session drops and cuts at damage (see the module
    docstring)."""

    def reclaim(self) -> list[ReclaimAction]:
        """Run reclaim for each medium over its high watermark, and return every action
        not yet taken (including those ``prepare_store`` ran)."""
        rc = self.config.reclaim
        if self.ssd.used_bytes > rc.ssd_high * self.ssd.capacity_bytes:
            self._reclaim_ssd(self.ssd.used_bytes)
        if self.arena.used_bytes > rc.memory_high * self.arena.capacity_bytes:
            self._reclaim_memory(self.arena.used_bytes, 0)
        return self.take_reclaim_actions()

    def take_reclaim_actions(self) -> list[ReclaimAction]:
        """Drain the reclaim actions done so far (the data plane deletes the files)."""
        out, self._actions = self._actions, []
        return out

    def _victims(self, medium: Medium, used_bytes: int) -> list[SessionRecord]:
        rc = self.config.reclaim
        if medium == Medium.SSD:
            cap, high, low = self.ssd.capacity_bytes, rc.ssd_high, rc.ssd_low
        else:
            cap, high, low = self.arena.capacity_bytes, rc.memory_high, rc.memory_low
        usage = [SessionUsage(r.session_id, r.last_access, r.num_pins > 0, r.bytes_on(medium))
                 for r in self._sessions.values()]
        victims = choose_victims(usage, used_bytes, cap, high, low)
        self._reclaimed[medium] += len(victims)
        if victims:
            logger.debug("reclaiming %d sessions on %s", len(victims), medium.name)
        return [self._sessions[sid] for sid in victims]

    def _reclaim_ssd(self, used_bytes: int) -> None:
        # A session's prefix starts in its SSD files: the whole session goes.
        for rec in self._victims(Medium.SSD, used_bytes):
            self._actions.append(self._drop(rec, Medium.SSD))

    def _reclaim_memory(self, used_bytes: int, need_bytes: int) -> None:
        """Memory use would be ``used_bytes`` (a write of ``need_bytes`` included): drop
        memory copies, then cut sessions at their first memory-homed segment, then drop
        the copies still in the way of ``need_bytes`` (the cuts may have opened a run)."""
        used_bytes -= self._drop_copies(
            used_bytes, need_bytes, self.config.reclaim.memory_low * self.arena.capacity_bytes)
        victims = self._victims(Medium.MEMORY, used_bytes)
        for rec in victims:
            self._actions.append(self._cut(rec, min(rec.memory_segment_ids), Medium.MEMORY))
        if victims and need_bytes:
            self._drop_copies(used_bytes, need_bytes, float(self.arena.capacity_bytes))

    def _drop_copies(self, used_bytes: int, need_bytes: int, target: float) -> int:
        """Drop memory copies no restore reads, least recently used first, until use
        (``used_bytes`` less what is freed) is at or under ``target``; then, if
        ``need_bytes`` still do not fit in one extent, the copies in the way: those in
        the cheapest run of free space and droppable copies that spans it
        (``HostArena.cheapest_window``), each copy priced at its bytes times its rank in
        LRU order (1 for the least recently used, n for the most): fragmentation drops
        few bytes of old copies rather than a copy just made or used, as close to LRU
        as one extent allows. With no such run no more copies go (dropping them could
        not make room). Returns the bytes freed."""
        freed = 0
        dropped: dict[str, list[Segment]] = {}
        for home_id in self.copies.homes_lru():
            if used_bytes - freed <= target:
                break
            freed += self._drop_copy(home_id, dropped)
        if need_bytes and not self.arena.can_fit(need_bytes):
            movable = {c.offset: h for h, c in ((h, self.copies.get(h))
                                                for h in self.copies.homes_lru())
                       if c is not None and c.segment_id not in self._copy_reads}
            # Least recently used first, so a copy's rank is its recency.
            prices = {offset: self.arena.size_of(offset) * rank
                      for rank, offset in enumerate(movable, start=1)}
            for offset in self.arena.cheapest_window(need_bytes, prices) or ():
                freed += self._drop_copy(movable[offset], dropped)
        for sid, copies in dropped.items():
            self._actions.append(ReclaimAction(sid, Medium.MEMORY, tuple(copies), (), (),
                                               False))
        return freed

    def _drop_copy(self, home_id: int, dropped: dict[str, list[Segment]]) -> int:
        """Drop the copy of ``home_id`` unless a load in flight reads it; returns the
        bytes freed and files the copy under its session in ``dropped``."""
        copy = self.copies.get(home_id)
        if copy is None or copy.segment_id in self._copy_reads:
            return 0
        rec = self._sessions[copy.session_id]
        self._free_copy(rec, home_id)
        dropped.setdefault(rec.session_id, []).append(copy)
        return copy.total_bytes

    def _free_copy(self, rec: SessionRecord, home_id: int) -> Segment:
        copy = self.copies.pop(home_id)
        if copy is None:
            raise KeyError(f"segment {home_id} has no memory copy")
        rec.copy_ids.remove(home_id)
        if not rec.copy_ids:
            self._copy_holders.discard(rec.session_id)
        rec.copy_bytes -= self.arena.free(copy.offset)
        self._copies_dropped += 1
        return copy

    def drop_session(self, session_id: str) -> ReclaimAction:
        """Forget a whole session now (e.g. the engine says it ended). Refuses a pinned
        session. The returned action is not queued."""
        rec = self.session(session_id)
        if rec.num_pins:
            raise ValueError(f"session_id {session_id!r} is pinned by {rec.num_pins} "
                             f"restores or writes in flight")
        return self._drop(rec, None)

    def _drop(self, rec: SessionRecord, medium: Medium | None) -> ReclaimAction:
        """The whole session: every segment, copy and file."""
        first = min((*rec.memory_segment_ids, *rec.ssd_segment_ids), default=0)
        action = self._cut(rec, first, medium)
        files = tuple(self.ssd.release_session(rec.session_id))
        rec.ssd_bytes = 0
        dropped = self._forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, action.memory_segments,
                             action.ssd_segments, (*action.file_ids, *files), dropped)

    def _cut(self, rec: SessionRecord, first_id: int, medium: Medium | None) -> ReclaimAction:
        """Unpublish every segment of ``rec`` with id >= ``first_id`` on both media
        (and their copies), give the SSD tail back: the file holding the first SSD
        segment dropped is cut there (deleted when nothing is left in it) and the
        session's later files are deleted. Nothing of it may be in flight."""
        mem_ids = [i for i in rec.memory_segment_ids if i >= first_id]
        ssd_ids = sorted(i for i in rec.ssd_segment_ids if i >= first_id)
        memory: list[Segment] = []
        for seg_id in mem_ids:
            seg = self.index.remove_segment(seg_id)
            rec.memory_bytes -= self.arena.free(seg.offset)
            memory.append(seg)
        memory.extend(self._free_copy(rec, i) for i in ssd_ids if i in rec.copy_ids)
        ssd = tuple(self.index.remove_segment(i) for i in ssd_ids)
        self._forget_damage(rec.session_id, ssd_ids)
        rec.memory_segment_ids = [i for i in rec.memory_segment_ids if i < first_id]
        rec.ssd_segment_ids = [i for i in rec.ssd_segment_ids if i < first_id]
        deleted: list[int] = []
        cuts: tuple[FileCut, ...] = ()
        if ssd:
            # Live SSD segments of a session lie in file order = id order.
            file_id, file_offset = int(ssd[0].file_id or 0), int(ssd[0].file_offset or 0)
            freed = self.ssd.truncate_file(file_id, file_offset)
            if self.ssd.file(file_id).extents:
                cuts = (FileCut(file_id, self.ssd.file(file_id).end_bytes),)
            else:
                freed += self.ssd.release_file(file_id)
                deleted.append(file_id)
            for later in self.ssd.files_of(rec.session_id):
                if later > file_id:
                    freed += self.ssd.release_file(later)
                    deleted.append(later)
            rec.ssd_bytes -= freed
        gone = self._forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, tuple(memory), ssd, tuple(deleted), gone,
                             cuts)

    # -- damage ----------------------------------------------------------------------

    def _tail_segment(self, session_id: str, from_segment_id: int) -> Segment:
        rec = self.session(session_id)
        if from_segment_id not in rec.ssd_segment_ids:
            raise KeyError(f"segment_id {from_segment_id!r} is not a live SSD segment of "
                           f"session_id {session_id!r}")
        return self.index.segment(from_segment_id)

    def tail_in_use(self, session_id: str, from_segment_id: int) -> bool:
        """Whether ``truncate_session(session_id, from_segment_id)`` must wait: a
        restore in flight reads a segment it would drop (or its copy), or a write into
        the session prepared after that segment is in flight (it would land behind the
        cut). Restores of the earlier segments do not block it."""
        self._tail_segment(session_id, from_segment_id)
        for p in self._pending_stores.values():
            if p.session_id == session_id and p.segment.segment_id > from_segment_id:
                return True
        for lp in self._loads.values():
            if session_id in lp.session_ids and any(
                    run.segment.session_id == session_id
                    and self.copies.home_id(run.segment) >= from_segment_id
                    for run in lp.hit.runs):
                return True
        return False

    def truncate_session(self, session_id: str, from_segment_id: int) -> ReclaimAction:
        """Cut a session at a damaged SSD segment: unpublish it and every later segment
        of the session on either medium (so no later block sits behind the hole), give
        their space back, and keep the earlier segments served.

        The returned action (not queued) names the file to truncate (``cut_files``; a
        file left with no segment is deleted instead) and the later files to delete;
        the next ``prepare_store`` of the session appends after its last good segment.
        Raises ``KeyError`` when the segment is not a live SSD segment of the session,
        ``ValueError`` while ``tail_in_use``.
        """
        self._tail_segment(session_id, from_segment_id)
        if self.tail_in_use(session_id, from_segment_id):
            raise ValueError(f"session_id {session_id!r}: a restore or write in flight uses "
                             f"segment {from_segment_id} or a later one; retry after it")
        action = self._cut(self._sessions[session_id], from_segment_id, None)
        self._truncated += 1
        logger.debug("session %r cut at segment %d: %d segments dropped", session_id,
                     from_segment_id, len(action.memory_segments) + len(action.ssd_segments))
        return action
