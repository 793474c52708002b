"""Reclaim and cuts: the control plane's verbs that drop books (no I/O).

A segment's blocks follow the blocks that were indexed when it was prepared, all in
segments with smaller ids. A lookup reaches a block only through every key before it,
so a segment whose prefix is gone is never hit (and never serves wrong KV: a key names
its whole prefix); it becomes reachable again when a later store writes that prefix.
SSD above its high watermark, in bytes or in the session files its address space maps
(``reclaim_spans``): whole sessions go (the cut at the first segment, files deleted).
Memory above its high watermark: first memory copies, then sessions lose their
memory-homed segments, and nothing else: their SSD segments stay published and
counted, files untouched, so the SSD turns of a session's other branches (or of a
conversation the session shares only a first block with) are still served. Either way
sessions go oldest last access first, never a pinned one, until use is at or under the
low watermark; nothing is written back or moved, but for one option: with
``placement.not_yet_write_back`` the not-yet homes go first, written to the SSD
(``reclaim_not_yet``). A damaged SSD segment *cuts* its
session (``truncate_session``): that segment and every later one on both media go and
its file is cut there (SSD files are cut only when SSD segments go); ``drop_session``
forgets a whole session on the engine's word.

Every verb returns (or queues, for ``take_reclaim_actions``) ``ReclaimAction`` values:
the files the data plane deletes or cuts and the arena ranges it may reuse.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping

from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from flatcake.control.alloc import HostArena
from flatcake.control.copies import MemoryCopies
from flatcake.control.damage import Damage
from flatcake.control.index import BlockIndex, Segment
from flatcake.control.notyet import NotYet
from flatcake.control.reclaim import SessionUsage, choose_victims
from flatcake.control.sessions import SessionRecord, SessionTable
from flatcake.control.spare import Spare
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.types import FileCut, LoadPlan, ReclaimAction, StorePlan
from flatcake.control.wear import Wear

logger = logging.getLogger(__name__)


class Reclaimer:
    """Reclaim by watermark, session drops and cuts (see the module docstring).

    Owns (written only here): the counts of sessions reclaimed per medium and of
    sessions cut at damage, and the draining of ``actions`` (the queue of reclaim actions
    not taken yet; ``Spare`` appends the copies it drops to it as well). Writes the parts
    it is given when it drops or cuts: index (unpublish), arena and SSD space (free),
    session records and the table (forgets empty sessions), memory copies (through
    ``spare``) and damage (``forget``). Reads ``stores`` (prepared, not completed, by
    segment id) and ``loads`` (in flight, by request id): they decide what may be cut.
    """

    def __init__(self, config: FlatCakeConfig, index: BlockIndex, arena: HostArena,
                 ssd: SsdSpace, copies: MemoryCopies, sessions: SessionTable,
                 spare: Spare, damage: Damage, actions: list[ReclaimAction],
                 stores: Mapping[int, StorePlan], loads: Mapping[Hashable, LoadPlan],
                 wear: Wear | None = None, not_yet: NotYet | None = None,
                 write_back: Callable[[Segment, int], bool] | None = None,
                 now: Callable[[], float] | None = None) -> None:
        self._config = config
        self._index = index
        self._arena = arena
        self._ssd = ssd
        self._copies = copies
        self._sessions = sessions
        self._spare = spare
        self._damage = damage
        self._actions = actions
        self._stores = stores
        self._loads = loads
        self._wear = wear if wear is not None else Wear()
        self._reclaimed = {Medium.MEMORY: 0, Medium.SSD: 0}
        self._truncated = 0
        # Not-yet homes written back at memory reclaim (``placement.not_yet_write_back``
        # on a host that writes them): the homes, the verb that writes one, and the
        # clock's time for the idle bound. Either None: nothing is written back.
        self._not_yet = not_yet
        self._write_back = write_back
        self._now = now if now is not None else (lambda: 0.0)

    def num_reclaimed(self, medium: Medium) -> int:
        """Sessions reclaimed (dropped, or cut for memory) on ``medium`` so far."""
        return self._reclaimed[medium]

    @property
    def num_truncated(self) -> int:
        """Sessions cut at a damaged segment so far."""
        return self._truncated

    # -- by watermark ----------------------------------------------------------------

    def reclaim(self) -> list[ReclaimAction]:
        """Run reclaim for each medium over its high watermark, and return every action
        not yet taken (including those ``prepare_store`` ran)."""
        rc = self._config.reclaim
        if self._ssd.used_bytes > rc.ssd_high * self._ssd.capacity_bytes:
            self.reclaim_ssd(self._ssd.used_bytes)
        if self._arena.used_bytes > rc.memory_high * self._arena.capacity_bytes:
            self.reclaim_memory(self._arena.used_bytes, 0)
        return self.take_reclaim_actions()

    def take_reclaim_actions(self) -> list[ReclaimAction]:
        """Drain the reclaim actions done so far (the data plane deletes the files)."""
        out = self._actions[:]
        self._actions.clear()
        return out

    def _victims(self, medium: Medium, used_bytes: int) -> list[SessionRecord]:
        rc = self._config.reclaim
        if medium == Medium.SSD:
            cap, high, low = self._ssd.capacity_bytes, rc.ssd_high, rc.ssd_low
        else:
            cap, high, low = self._arena.capacity_bytes, rc.memory_high, rc.memory_low
        usage = [SessionUsage(r.session_id, r.last_access, r.num_pins > 0, r.bytes_on(medium))
                 for r in self._sessions.values()]
        victims = choose_victims(usage, used_bytes, cap, high, low)
        self._reclaimed[medium] += len(victims)
        if victims:
            logger.debug("reclaiming %d sessions on %s", len(victims), medium.name)
        return [self._sessions[sid] for sid in victims]

    def reclaim_ssd(self, used_bytes: int) -> None:
        """SSD use would be ``used_bytes``: drop whole sessions (a session's prefix
        starts in its SSD files) down to the low watermark."""
        for rec in self._victims(Medium.SSD, used_bytes):
            self._actions.append(self._drop(rec, Medium.SSD))

    def reclaim_spans(self) -> None:
        """A new session file would take the SSD space's spans past the high watermark
        (it maps ``num_spans`` files at most, however few bytes they hold, so many
        short sessions run out of spans before bytes): drop whole sessions, oldest last
        access first, until the spans in use are at or under the low watermark."""
        rc, ssd = self._config.reclaim, self._ssd
        usage = [SessionUsage(r.session_id, r.last_access, r.num_pins > 0,
                              len(ssd.files_of(r.session_id)))
                 for r in self._sessions.values()]
        in_use = ssd.spans_in_use + 1
        victims = choose_victims(usage, in_use, ssd.num_spans, rc.ssd_high, rc.ssd_low)
        self._reclaimed[Medium.SSD] += len(victims)
        if victims:
            logger.debug("reclaiming %d sessions for SSD file spans", len(victims))
        for sid in victims:
            self._actions.append(self._drop(self._sessions[sid], Medium.SSD))

    def reclaim_memory(self, used_bytes: int, need_bytes: int) -> None:
        """Memory use would be ``used_bytes`` (a write of ``need_bytes`` included): drop
        memory copies, then the memory-homed segments of whole sessions (their SSD
        segments stay), then the copies still in the way of ``need_bytes`` (the freed
        segments may have opened a run). Not-yet homes go first when they are written
        back (``reclaim_not_yet``)."""
        used_bytes -= self.reclaim_not_yet(used_bytes)
        used_bytes -= self._spare.drop_copies(
            used_bytes, need_bytes, self._config.reclaim.memory_low * self._arena.capacity_bytes)
        victims = self._victims(Medium.MEMORY, used_bytes)
        for rec in victims:
            memory = self._unpublish_memory(rec, rec.memory_segment_ids)
            gone = self._sessions.forget_if_empty(rec)
            self._actions.append(ReclaimAction(rec.session_id, Medium.MEMORY, memory, (), (),
                                               gone))
        if victims and need_bytes:
            self._spare.drop_copies(used_bytes, need_bytes, float(self._arena.capacity_bytes))

    def reclaim_not_yet(self, used_bytes: int) -> int:
        """With write-backs on: the not-yet homes, oldest session last access first,
        until memory use less the homes freed or being written back is at or under the
        low watermark. A home whose session has been idle longer than
        ``placement.not_yet_idle_s`` (when set) is dropped unwritten; any other is
        written to the SSD (freed once durable). Sessions a restore or write pins keep
        theirs. Returns the bytes freed or being written back."""
        ny, write = self._not_yet, self._write_back
        if ny is None or write is None:
            return 0
        target = self._config.reclaim.memory_low * self._arena.capacity_bytes
        idle = self._config.placement.not_yet_idle_s
        now = self._now()
        freed = ny.writing_back_bytes()
        for seg, first in ny.homes_lru():
            if used_bytes - freed <= target:
                break
            rec = self._sessions[seg.session_id]
            if rec.num_pins:
                continue
            if idle and now - rec.last_access > idle:
                freed += ny.drop(seg)
                self._actions.append(ReclaimAction(rec.session_id, Medium.MEMORY, (seg,), (),
                                                   (), self._sessions.forget_if_empty(rec)))
            elif write(seg, first):
                freed += seg.total_bytes
        return freed

    # -- drops and cuts --------------------------------------------------------------

    def drop_session(self, session_id: str) -> ReclaimAction:
        """Forget a whole session now (e.g. the engine says it ended). Refuses a pinned
        session. The returned action is not queued."""
        rec = self._sessions.session(session_id)
        if rec.num_pins:
            raise ValueError(f"session_id {session_id!r} is pinned by {rec.num_pins} "
                             f"restores or writes in flight")
        return self._drop(rec, None)

    def _drop(self, rec: SessionRecord, medium: Medium | None) -> ReclaimAction:
        """The whole session: every segment, copy and file."""
        first = min((*rec.memory_segment_ids, *rec.ssd_segment_ids), default=0)
        action = self._cut(rec, first, medium)
        files = tuple(self._ssd.release_session(rec.session_id))
        rec.ssd_bytes = 0
        dropped = self._sessions.forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, action.memory_segments,
                             action.ssd_segments, (*action.file_ids, *files), dropped)

    def _cut(self, rec: SessionRecord, first_id: int, medium: Medium | None) -> ReclaimAction:
        """Unpublish every segment of ``rec`` with id >= ``first_id`` on both media
        (and their copies), give the SSD tail back: the file holding the first SSD
        segment dropped is cut there (deleted when nothing is left in it) and the
        session's later files are deleted. Nothing of it may be in flight."""
        index, ssd_space = self._index, self._ssd
        ssd_ids = sorted(i for i in rec.ssd_segment_ids if i >= first_id)
        memory = [*self._unpublish_memory(rec, [i for i in rec.memory_segment_ids
                                                if i >= first_id]),
                  *(piece for i in ssd_ids if i in rec.copy_ids
                    for piece in self._spare.free(rec, i).pieces)]
        ssd = tuple(index.remove_segment(i) for i in ssd_ids)
        self._wear.dropped(ssd)
        self._damage.forget(rec.session_id, ssd_ids)
        rec.remove_segments(ssd)
        deleted: list[int] = []
        cuts: tuple[FileCut, ...] = ()
        if ssd:
            # Live SSD segments of a session lie in file order = id order.
            file_id, file_offset = int(ssd[0].file_id or 0), int(ssd[0].file_offset or 0)
            freed = ssd_space.truncate_file(file_id, file_offset)
            if ssd_space.file(file_id).extents:
                cuts = (FileCut(file_id, ssd_space.file(file_id).end_bytes),)
            else:
                freed += ssd_space.release_file(file_id)
                deleted.append(file_id)
            for later in ssd_space.files_of(rec.session_id):
                if later > file_id:
                    freed += ssd_space.release_file(later)
                    deleted.append(later)
            rec.ssd_bytes -= freed
        gone = self._sessions.forget_if_empty(rec)
        return ReclaimAction(rec.session_id, medium, tuple(memory), ssd, tuple(deleted), gone,
                             cuts)

    def _unpublish_memory(self, rec: SessionRecord, seg_ids: list[int]
                          ) -> tuple[Segment, ...]:
        """Unpublish the memory-homed segments ``seg_ids`` of ``rec`` and free their
        arena ranges; keys they owned pass to a shadow (another session's copy of the
        same blocks) or disappear."""
        memory = tuple(self._index.remove_segment(i) for i in seg_ids)
        for seg in memory:
            rec.memory_bytes -= self._arena.free(seg.offset)
        rec.remove_segments(memory)
        return memory

    # -- cuts at damage --------------------------------------------------------------

    def _tail_segment(self, session_id: str, from_segment_id: int) -> Segment:
        rec = self._sessions.session(session_id)
        if from_segment_id not in rec.ssd_segment_ids:
            raise KeyError(f"segment_id {from_segment_id!r} is not a live SSD segment of "
                           f"session_id {session_id!r}")
        return self._index.segment(from_segment_id)

    def tail_in_use(self, session_id: str, from_segment_id: int) -> bool:
        """Whether ``truncate_session(session_id, from_segment_id)`` must wait: a
        restore in flight reads a segment it would drop (or its copy), or a write into
        the session prepared after that segment is in flight (it would land behind the
        cut). Restores of the earlier segments do not block it."""
        self._tail_segment(session_id, from_segment_id)
        for p in self._stores.values():
            if p.session_id == session_id and p.segment.segment_id > from_segment_id:
                return True
        for lp in self._loads.values():
            if session_id in lp.session_ids and any(
                    run.segment.session_id == session_id
                    and self._copies.home_id(run.segment) >= from_segment_id
                    for run in lp.hit.runs):
                return True
        return False

    def truncate_session(self, session_id: str, from_segment_id: int) -> ReclaimAction:
        """``ControlPlane.truncate_session``: cut a session at a damaged SSD segment
        (``KeyError`` when it is not a live SSD segment of the session, ``ValueError``
        while ``tail_in_use``); the action is not queued."""
        self._tail_segment(session_id, from_segment_id)
        if self.tail_in_use(session_id, from_segment_id):
            raise ValueError(f"session_id {session_id!r}: a restore or write in flight uses "
                             f"segment {from_segment_id} or a later one; retry after it")
        action = self._cut(self._sessions[session_id], from_segment_id, None)
        self._truncated += 1
        logger.debug("session %r cut at segment %d: %d segments dropped", session_id,
                     from_segment_id, len(action.memory_segments) + len(action.ssd_segments))
        return action
