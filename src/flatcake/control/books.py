"""The state of a ``ControlPlane`` and the questions hosts ask of it.

``_Books`` owns the parts (block index, host arena, SSD space, memory copies, FC-MAS
scheduler) and the per-session records; ``ControlPlane`` adds the verbs that change
them (``plane``, ``reclaimer``, ``restart``). Hosts (the store, the vLLM connector, the
replay, tools) read the books through the query methods here, never by reaching into
``index`` / ``ssd`` / ``arena`` / ``copies`` / ``scheduler``: those attributes stay for
the control plane's own modules and its white-box tests.

Single-threaded: the owner serialises calls (see ``plane``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Iterator

from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from flatcake.control.alloc import HostArena
from flatcake.control.copies import MemoryCopies
from flatcake.control.index import BlockIndex, BlockLocation, Segment
from flatcake.control.placement import PlacementRule
from flatcake.control.queues import RestoreRequest
from flatcake.control.scheduler import MasScheduler, SchedulerStats
from flatcake.control.sessions import SessionRecord
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.types import ControlStats, LoadPlan, ReclaimAction, StorePlan
from flatcake.geometry import KVGeometry
from flatcake.layout import ALIGN
from flatcake.readplan import ReadPlanner


class _Books:
    """Books of one node's FlatCake store.

    Attributes:
        geometry: KV geometry of the blocks stored (all segments share it).
        config: the whole configuration (placement, reclaim, planner, scheduler, store).
        clock: the time source for last access and restore waits.
        planner: the read planner ``prepare_load`` calls when its caller names none
            (the books plan no reads of their own: the planners live in ``plan``, the
            floor above); ``None``: every ``prepare_load`` names one.
        index: the block index.
        arena: the host-memory arena allocator.
        ssd: the node's SSD virtual space.
        copies: memory copies of SSD segments, by home segment id.
        scheduler: the FC-MAS scheduler, on the same clock.
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig | None = None,
                 clock: Clock | None = None, *, planner: ReadPlanner | None = None,
                 file_header_bytes: int = ALIGN) -> None:
        if not isinstance(geometry, KVGeometry):
            raise ValueError(f"geometry must be a KVGeometry, got {type(geometry).__name__}")
        self.geometry = geometry
        self.config = config if config is not None else FlatCakeConfig()
        self.clock: Clock = clock if clock is not None else WallClock()
        self.planner = planner
        store = self.config.store
        self.node_id = store.node_id
        self.index = BlockIndex()
        self.arena = HostArena(store.memory_capacity_bytes)
        self.ssd = SsdSpace(store.node_id, store.ssd_capacity_bytes, store.session_file_bytes,
                            file_header_bytes)
        self.scheduler = MasScheduler(self.config.scheduler, self.clock)
        self._sessions: dict[str, SessionRecord] = {}
        self._pending_stores: dict[int, StorePlan] = {}
        self._loads: dict[Hashable, LoadPlan] = {}
        self._actions: list[ReclaimAction] = []
        self._rules: Counter[PlacementRule] = Counter()
        self._next_segment_id = 0
        self._reclaimed = {Medium.MEMORY: 0, Medium.SSD: 0}
        self._rejected = 0
        self._truncated = 0
        self.copies = MemoryCopies()
        self._copy_holders: set[str] = set()  # sessions with published copies
        # Memory segments (copies among them) that loads in flight read -> how many:
        # a copy is dropped only when no load reads it.
        self._copy_reads: Counter[int] = Counter()
        # Copies written ahead of their segment (complete_copy): first key -> plan.
        # key -> (store in flight whose memory copy holds it, position in that copy)
        self._early: dict[bytes, tuple[StorePlan, int]] = {}
        # Their copy segment ids -> whether the copy owns every entry of its keys.
        self._early_ids: dict[int, bool] = {}
        self._copies_made = 0
        self._copies_dropped = 0
        # Damage (``damage``): SSD segments that failed a checksum, and per session the
        # earliest of them on disk, where the session is to be cut.
        self._damaged: set[int] = set()
        self._cut_at: dict[str, int] = {}
        # Session files whose own header a restore found damaged (``mark_damaged``):
        # a cut at one of their segments drops the session and quarantines its files.
        self._bad_headers: set[int] = set()
        # Keys of the stores in flight (prepare_store .. complete_store) -> how many:
        # a lookup that stops at one waits for it rather than recompute it.
        self._writing: Counter[bytes] = Counter()

    # -- sessions --------------------------------------------------------------------

    def session(self, session_id: str) -> SessionRecord:
        """The books of a session (``KeyError`` naming it when unknown)."""
        try:
            return self._sessions[session_id]
        except KeyError:
            raise KeyError(f"unknown session_id {session_id!r}") from None

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def newest_turn_index(self, session_id: str) -> int:
        """The largest turn index among the session's live segments (either medium),
        ``-1`` when it has none; ``KeyError`` when the session is unknown."""
        rec = self.session(session_id)
        return max((self.index.segment(i).turn_index
                    for i in (*rec.memory_segment_ids, *rec.ssd_segment_ids)), default=-1)

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

    def memory_copy(self, segment_id: int) -> Segment | None:
        """The published memory copy of SSD segment ``segment_id``, or ``None``."""
        return self.copies.get(segment_id)

    def memory_copies(self) -> Iterator[Segment]:
        """Every published memory copy."""
        return iter(self.copies)

    def home_segment_id(self, segment: Segment) -> int:
        """The id of the segment ``segment`` stands for: its home's id for a memory
        copy, else its own."""
        return self.copies.home_id(segment)

    # -- session files ---------------------------------------------------------------

    def files_of(self, session_id: str) -> list[int]:
        """The session's files in creation order (empty when it has none)."""
        return self.ssd.files_of(session_id)

    def file_end_bytes(self, file_id: int) -> int:
        """Where the books' next append into file ``file_id`` goes (the end of its last
        segment, at least its header); ``KeyError`` when the file is not live."""
        return self.ssd.file(file_id).end_bytes

    # -- budgets ---------------------------------------------------------------------

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
        return key in self._writing

    # -- FC-MAS restore order --------------------------------------------------------

    def restore_request(self, request_id: Hashable, arrival_time: float,
                        plan: LoadPlan | None, remote_blocks: int = 0) -> RestoreRequest:
        """The restore as FC-MAS sees it, for every host the same: its KV bytes are
        the SSD bytes the local plan needs (``ReadPlan.useful_bytes``) plus every block
        other nodes send (``remote_blocks`` whole blocks, all layers, whatever their
        medium there: they cross the network either way); it waits in the SSD queue
        when the local plan reads SSD or anything comes from another node."""
        g = self.geometry
        far = remote_blocks * g.num_layers * g.block_bytes_per_layer
        local = plan.read_plan.useful_bytes if plan is not None else 0
        ssd = remote_blocks > 0 or (plan is not None and plan.hit.needs_ssd)
        return RestoreRequest(request_id, arrival_time, local + far, ssd)

    def submit_restore(self, plan: LoadPlan, remote_blocks: int = 0) -> None:
        """Queue a planned restore in FC-MAS, arriving now (``restore_request``)."""
        self.scheduler.submit(self.restore_request(plan.request_id, self.clock.now(), plan,
                                                   remote_blocks))

    def next_restores(self) -> list[RestoreRequest]:
        """The SSD restores FC-MAS starts now (see ``MasScheduler.next_restores``)."""
        return self.scheduler.next_restores()

    def restore_done(self, request_id: Hashable) -> None:
        """An SSD restore finished: the request becomes ready at its arrival position."""
        self.scheduler.restore_done(request_id)

    def pop_ready_restore(self) -> RestoreRequest | None:
        """The next request FC-MAS lets run, or ``None`` when none is ready."""
        return self.scheduler.pop_ready()

    @property
    def restores_in_flight(self) -> int:
        """SSD restores FC-MAS started and not yet reported done."""
        return self.scheduler.num_in_flight

    def restore_stats(self) -> SchedulerStats:
        """FC-MAS counters since construction."""
        return self.scheduler.stats

    # -- internals shared by the verbs ------------------------------------------------

    def _live_segment_ids(self, seg: Segment) -> tuple[int, ...]:
        if self.copies.is_live(seg) or seg.segment_id in self._early_ids:
            return (seg.segment_id,)
        try:
            return (seg.segment_id,) if self.index.segment(seg.segment_id) is seg else ()
        except KeyError:
            return ()

    def _forget_damage(self, session_id: str, removed: Iterable[int]) -> None:
        """Segments of ``session_id`` left the books: they are damaged no more, and a
        pending cut at one of them is done."""
        self._damaged.difference_update(removed)
        if self._cut_at.get(session_id, -1) not in self._damaged:
            self._cut_at.pop(session_id, None)

    def _forget_if_empty(self, rec: SessionRecord) -> bool:
        if rec.num_pins == 0 and rec.num_segments == 0 and not self.ssd.files_of(
                rec.session_id):
            self._sessions.pop(rec.session_id, None)
            return True
        return False

    # -- reporting -------------------------------------------------------------------

    def stats(self) -> ControlStats:
        rc = self.config.reclaim
        recs = self._sessions.values()
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
            stores_in_flight=len(self._pending_stores),
            loads_in_flight=len(self._loads),
            placements_by_rule={r.value: self._rules[r] for r in PlacementRule},
            sessions_reclaimed_memory=self._reclaimed[Medium.MEMORY],
            sessions_reclaimed_ssd=self._reclaimed[Medium.SSD],
            stores_rejected=self._rejected,
            sessions_truncated=self._truncated,
            num_memory_copies=len(self.copies),
            memory_copy_bytes=sum(r.copy_bytes for r in recs),
            memory_copies_made=self._copies_made,
            memory_copies_dropped=self._copies_dropped,
        )
