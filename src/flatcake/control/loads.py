"""The load verbs behind ``ControlPlane``: plan a restore and pin what it reads, then
unpin and touch it (no I/O)::

    prepare(request, keys | hit) ─► LoadPlan: the hit (looked up again, or checked
                                    live), its ReadPlan, its sessions pinned, its memory
                                    segments counted as read, maybe refills
    complete(request, refilled) ──► refills published or freed, sessions unpinned and
                                    touched, reads uncounted, SSD bytes read counted (wear)

Single-threaded, like every verb.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence

from flatcake.clock import Clock
from flatcake.config import FlatCakeConfig
from flatcake.control.copies import EarlyCopies, MemoryCopies
from flatcake.control.index import BlockIndex, PrefixHit, Segment
from flatcake.control.sessions import SessionTable
from flatcake.control.spare import Spare
from flatcake.control.types import LoadPlan
from flatcake.control.wear import Wear
from flatcake.control.windows import restore_view
from flatcake.geometry import KVGeometry
from flatcake.readplan import ReadPlanner

# How ``prepare_load`` refuses a hit whose segments were reclaimed since the lookup.
STALE_HIT = "stale PrefixHit"


class Loads:
    """The loads in flight, from ``prepare`` to ``complete``.

    Owns (written only here): ``loads``, the loads in flight by request id (the
    ``Reclaimer`` reads it: nothing a load reads may be cut). Writes the pins and last
    access of session records, and the reads and refills of memory copies through
    ``spare``. Reads the index, the memory copies and the early copies (an SSD run's
    file and offset are its segment's own: a restore asks the SSD space nothing).
    """

    def __init__(self, config: FlatCakeConfig, geometry: KVGeometry, clock: Clock,
                 planner: ReadPlanner | None, index: BlockIndex, copies: MemoryCopies,
                 sessions: SessionTable, spare: Spare, early: EarlyCopies,
                 lookup: Callable[[Sequence[bytes]], PrefixHit],
                 loads: dict[Hashable, LoadPlan], wear: Wear | None = None) -> None:
        self._config = config
        self._geometry = geometry
        self._clock = clock
        self._planner = planner
        self._index = index
        self._copies = copies
        self._sessions = sessions
        self._spare = spare
        self._early = early
        self._lookup = lookup  # the facade's: the servable prefix
        self._loads = loads
        self._wear = wear if wear is not None else Wear()
        # Asked of every restore: a geometry without sliding windows plans the hit's
        # runs as they are (``restore_view`` changes nothing there).
        self._windowed = bool(geometry.layer_window_blocks)

    @property
    def loads(self) -> Mapping[Hashable, LoadPlan]:
        """The loads in flight by request id (read-only)."""
        return self._loads

    def is_live(self, seg: Segment) -> bool:
        """Whether ``seg`` (from a hit) still serves: published, or a memory copy still
        held (published, or written early)."""
        if self._copies.is_live(seg) or self._early.holds(seg.segment_id):
            return True
        return self._index.segment_or_none(seg.segment_id) == seg

    def prepare(self, request_id: Hashable, keys_or_hit: Sequence[bytes] | PrefixHit,
                planner: ReadPlanner | None, refill: bool) -> LoadPlan:
        """``ControlPlane.prepare_load``."""
        if request_id in self._loads:
            raise ValueError(f"request_id {request_id!r} already has a load in flight")
        planner = planner if planner is not None else self._planner
        if planner is None:
            raise ValueError("prepare_load needs a read planner: pass planner= here or to "
                             "ControlPlane (e.g. flatcake.plan.reads.plan_reads)")
        if isinstance(keys_or_hit, PrefixHit):
            hit = keys_or_hit
            published = self._index.segment_or_none
            for run in hit.runs:
                seg = run.segment
                if published(seg.segment_id) != seg and not self.is_live(seg):
                    raise ValueError(f"{STALE_HIT}: segment {seg.segment_id} was "
                                     f"reclaimed; look the keys up again")
        else:
            hit = self._lookup(keys_or_hit)
        # The window rows a hit runs past are held for hits ending there, not read.
        runs = restore_view(hit.runs) if self._windowed else hit.runs
        read_plan = planner(runs, self._geometry.num_layers, self._config.planner)
        sessions = hit.session_ids
        for sid in sessions:
            self._sessions[sid].num_pins += 1
        if hit.num_memory_blocks:  # an SSD restore reads no memory segment
            self._spare.start_reads(hit)
        refills = self._spare.refills(hit) if refill and self._config.placement.copy_on_restore \
            and hit.num_ssd_blocks else ()
        plan = LoadPlan(request_id, hit, read_plan, sessions, refills)
        self._loads[request_id] = plan
        return plan

    def complete(self, request_id: Hashable, refilled: Collection[int]) -> None:
        """``ControlPlane.complete_load``."""
        plan = self._loads.pop(request_id, None)
        if plan is None:
            raise KeyError(f"request_id {request_id!r} has no load in flight")
        if plan.refills:
            self._spare.finish_refills(plan.refills, refilled)
        now = self._clock.now()
        for sid in plan.session_ids:
            rec = self._sessions[sid]
            rec.num_pins -= 1
            rec.last_access = now
        if plan.hit.num_memory_blocks:
            self._spare.end_reads(plan.hit)
        self._wear.read(plan.hit, plan.read_plan.bytes_read)
