"""The questions hosts ask of a ``ControlPlane``: sessions, segments and blocks, files,
budgets, stores in flight, damage, FC-MAS restore order and stats.

``Books`` is the read side of the facade (``control.plane``): it declares the parts and
collaborators the ``ControlPlane`` constructor creates, writes none of them, and answers
through them. Hosts (the store, the vLLM connector, the replay, tools) ask here, never by
reaching into ``index`` / ``ssd`` / ``arena`` / ``copies`` / ``scheduler``: those
attributes stay for the control plane's own modules and its white-box tests.

Single-threaded: the owner serialises calls (see ``plane``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from flatcake.clock import Clock
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from flatcake.control.alloc import HostArena
from flatcake.control.copies import ArenaCopy, MemoryCopies
from flatcake.control.damage import Damage
from flatcake.control.index import BlockIndex, BlockLocation, Segment
from flatcake.control.loads import Loads
from flatcake.control.placement import PlacementRule
from flatcake.control.reclaimer import Reclaimer
from flatcake.control.releases import Releases
from flatcake.control.scheduler import MasScheduler, RestoreRequest, SchedulerStats
from flatcake.control.sessions import SessionRecord, SessionTable
from flatcake.control.spare import Spare
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.stores import Stores
from flatcake.control.types import ControlStats, LoadPlan
from flatcake.control.wear import Wear, WearCounts
from flatcake.geometry import KVGeometry
from flatcake.readplan import ReadPlanner


class Books:
    """The query methods of ``ControlPlane`` (every field is set by its constructor).

    Attributes:
        index: the block index.
        arena: the host-memory arena allocator.
        ssd: the node's SSD virtual space.
        copies: memory copies of SSD segments, by home segment id.
        scheduler: the FC-MAS scheduler, on the same clock.
    """

    index: BlockIndex
    arena: HostArena
    ssd: SsdSpace
    copies: MemoryCopies
    scheduler: MasScheduler
    _queues: dict[Hashable, MasScheduler]
    _geometry: KVGeometry
    _config: FlatCakeConfig
    _clock: Clock
    _node_id: int
    _planner: ReadPlanner | None
    _sessions: SessionTable
    _stores: Stores
    _loads: Loads
    _spare: Spare
    _damage: Damage
    _reclaimer: Reclaimer
    _releases: Releases | None
    _wear: Wear

    # -- what it was built with ------------------------------------------------------

    @property
    def geometry(self) -> KVGeometry:
        """KV geometry of the blocks stored (all segments share it)."""
        return self._geometry

    @property
    def config(self) -> FlatCakeConfig:
        """The whole configuration (placement, reclaim, planner, scheduler, store),
        fixed at construction: the parts were sized and the collaborators built by it."""
        return self._config

    @property
    def clock(self) -> Clock:
        """The time source for last access and restore waits."""
        return self._clock

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def planner(self) -> ReadPlanner | None:
        """The read planner ``prepare_load`` calls when its caller names none (the
        books plan no reads of their own: the planners live in ``plan``, the floor
        above); ``None``: every ``prepare_load`` names one."""
        return self._planner

    # -- sessions --------------------------------------------------------------------

    def session(self, session_id: str) -> SessionRecord:
        """The books of a session (``KeyError`` naming it when unknown)."""
        return self._sessions.session(session_id)

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def newest_turn_index(self, session_id: str) -> int:
        """The largest turn index among the session's live segments (either medium),
        ``-1`` when it has none; ``KeyError`` when the session is unknown."""
        return self.session(session_id).newest_turn  # kept by the record: O(1)

    # -- segments and blocks ---------------------------------------------------------

    def segment(self, segment_id: int) -> Segment:
        """The published segment ``segment_id``; ``KeyError`` naming it when it is not
        (never was, or was reclaimed or cut)."""
        return self.index.segment(segment_id)

    def segments(self) -> Iterator[Segment]:
        """Every published segment (memory copies not included)."""
        return self.index.segments()

    def locate(self, key: bytes) -> BlockLocation | None:
        """Where the published block ``key`` lives (its home), ``None`` when no
        published segment holds it."""
        return self.index.get(key)

    def memory_copy(self, segment_id: int) -> ArenaCopy | None:
        """The published memory copy of SSD segment ``segment_id``, or ``None``."""
        return self.copies.get(segment_id)

    def memory_copies(self) -> Iterator[ArenaCopy]:
        """Every published memory copy."""
        return iter(self.copies)

    def home_segment_id(self, segment: Segment) -> int:
        """The id of the segment ``segment`` stands for: its home's id for a piece of a
        memory copy, else its own."""
        return self.copies.home_id(segment)

    # -- session files ---------------------------------------------------------------

    def files_of(self, session_id: str) -> list[int]:
        """The session's files in creation order (empty when it has none)."""
        return self.ssd.files_of(session_id)

    def file_end_bytes(self, file_id: int) -> int:
        """Where the books' next append into file ``file_id`` goes (the end of its last
        segment, at least its header); ``KeyError`` when the file is not live."""
        return self.ssd.file(file_id).end_bytes

    # -- budgets and work in flight --------------------------------------------------

    @property
    def memory_used_bytes(self) -> int:
        """Host arena bytes allocated (memory-homed segments and memory copies)."""
        return self.arena.used_bytes

    @property
    def memory_capacity_bytes(self) -> int:
        return self.arena.capacity_bytes

    @property
    def ssd_used_bytes(self) -> int:
        """SSD bytes allocated (file headers and segments)."""
        return self.ssd.used_bytes

    @property
    def ssd_capacity_bytes(self) -> int:
        return self.ssd.capacity_bytes

    def store_in_flight(self, key: bytes) -> bool:
        """Whether a store planned and not completed yet writes ``key``."""
        return key in self._stores.keys_in_flight

    # -- damage ----------------------------------------------------------------------

    def is_damaged(self, segment_id: int) -> bool:
        return self._damage.is_damaged(segment_id)

    @property
    def num_damaged(self) -> int:
        """Damaged segments still in the books (their sessions not cut yet)."""
        return self._damage.num_damaged

    def cut_pending(self, session_id: str) -> bool:
        """Whether the session waits to be cut before a damaged segment (a write into
        it should wait: it would land behind the cut)."""
        return self._damage.cut_pending(session_id)

    def tail_in_use(self, session_id: str, from_segment_id: int) -> bool:
        """Whether ``truncate_session(session_id, from_segment_id)`` must wait: a
        restore in flight reads a segment it would drop (or its copy), or a write into
        the session prepared after that segment is in flight (it would land behind the
        cut). Restores of the earlier segments do not block it."""
        return self._reclaimer.tail_in_use(session_id, from_segment_id)

    # -- FC-MAS restore order --------------------------------------------------------

    def restore_request(self, request_id: Hashable, arrival_time: float,
                        plan: LoadPlan | None, remote_blocks: int = 0) -> RestoreRequest:
        """The restore as FC-MAS sees it, for every host the same: its KV bytes are
        the SSD bytes the local plan needs (``ReadPlan.useful_bytes``) plus every block
        other nodes send (``remote_blocks`` whole blocks, all layers, whatever their
        medium there: they cross the network either way); it waits in the SSD queue
        when the local plan reads SSD or anything comes from another node."""
        # Most restores are local: the geometry's block size is not even asked.
        far = remote_blocks * self._geometry.block_bytes if remote_blocks else 0
        local = plan.read_plan.useful_bytes if plan is not None else 0
        ssd = remote_blocks > 0 or (plan is not None and plan.hit.needs_ssd)
        return RestoreRequest(request_id, arrival_time, local + far, ssd)

    def restore_queue(self, queue: Hashable = None) -> MasScheduler:
        """The FC-MAS queue named ``queue``: ``None`` is the node's own (``scheduler``);
        a node service gives each attached engine one of its own (its GPU's SSD
        restores), created on first use over the same clock and settings."""
        if queue is None:
            return self.scheduler
        sched = self._queues.get(queue)
        if sched is None:
            sched = self._queues[queue] = MasScheduler(self._config.scheduler, self._clock)
        return sched

    def drop_restore_queue(self, queue: Hashable) -> None:
        """Forget an engine's FC-MAS queue (the engine detached)."""
        self._queues.pop(queue, None)

    def submit_restore(self, plan: LoadPlan, remote_blocks: int = 0,
                       queue: Hashable = None) -> None:
        """Queue a planned restore in FC-MAS, arriving now (``restore_request``)."""
        self.restore_queue(queue).submit(self.restore_request(
            plan.request_id, self._clock.now(), plan, remote_blocks))

    def next_restores(self, queue: Hashable = None) -> list[RestoreRequest]:
        """The SSD restores FC-MAS starts now (see ``MasScheduler.next_restores``)."""
        return self.restore_queue(queue).next_restores()

    def restore_done(self, request_id: Hashable, queue: Hashable = None) -> None:
        """An SSD restore finished: the request becomes ready at its arrival position."""
        self.restore_queue(queue).restore_done(request_id)

    def pop_ready_restore(self, queue: Hashable = None) -> RestoreRequest | None:
        """The next request FC-MAS lets run, or ``None`` when none is ready."""
        return self.restore_queue(queue).pop_ready()

    def restores_in_flight_in(self, queue: Hashable = None) -> int:
        """SSD restores of ``queue`` FC-MAS started and not yet reported done."""
        return self.restore_queue(queue).num_in_flight

    @property
    def restores_in_flight(self) -> int:
        """SSD restores FC-MAS started and not yet reported done (the node's queue)."""
        return self.scheduler.num_in_flight

    def restore_stats(self, queue: Hashable = None) -> SchedulerStats:
        """FC-MAS counters of ``queue`` since it was created."""
        return self.restore_queue(queue).stats

    # -- reporting -------------------------------------------------------------------

    def stats(self) -> ControlStats:
        rc = self._config.reclaim
        recs = self._sessions.values()
        stores, reclaimer, spare = self._stores, self._reclaimer, self._spare
        wear = self._wear.counts()
        return ControlStats(
            memory_used_bytes=self.arena.used_bytes,
            memory_capacity_bytes=self.arena.capacity_bytes,
            ssd_used_bytes=self.ssd.used_bytes,
            ssd_capacity_bytes=self.ssd.capacity_bytes,
            memory_high=rc.memory_high,
            memory_low=rc.memory_low,
            ssd_high=rc.ssd_high,
            ssd_low=rc.ssd_low,
            num_sessions=len(self._sessions),
            num_pinned_sessions=sum(1 for r in recs if r.num_pins),
            num_memory_segments=sum(len(r.memory_segment_ids) for r in recs),
            num_ssd_segments=sum(len(r.ssd_segment_ids) for r in recs),
            num_files=self.ssd.num_files,
            num_keys=len(self.index),
            stores_in_flight=len(stores.pending),
            loads_in_flight=len(self._loads.loads),
            placements_by_rule={r.value: stores.num_placed(r) for r in PlacementRule},
            sessions_reclaimed_memory=reclaimer.num_reclaimed(Medium.MEMORY),
            sessions_reclaimed_ssd=reclaimer.num_reclaimed(Medium.SSD),
            stores_rejected=stores.num_rejected,
            sessions_truncated=reclaimer.num_truncated,
            num_memory_copies=len(self.copies),
            memory_copy_bytes=sum(r.copy_bytes for r in recs),
            memory_copies_made=spare.num_made,
            memory_copies_dropped=spare.num_dropped,
            window_bytes_released=self._releases.released_bytes
            if self._releases is not None else 0,
            ssd_written_bytes=wear.written_bytes,
            ssd_read_bytes=wear.read_bytes,
            ssd_dropped_unread_bytes=wear.dropped_unread_bytes,
            ssd_unread_bytes=wear.unread_bytes,
        )

    def ssd_wear(self) -> WearCounts:
        """SSD bytes written, read back, dropped unread and live unread so far
        (``control.wear``); cheap enough for every metrics interval."""
        return self._wear.counts()
