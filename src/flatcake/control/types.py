"""The value types the control plane hands to the data plane and to reporting: what to
write (``StorePlan``), what to read (``LoadPlan``), what reclaim or a cut dropped
(``ReclaimAction``, ``FileCut``) and a stats snapshot (``ControlStats``). Frozen and
slotted; no behaviour beyond derived fields.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from flatcake.control.address import Medium
from flatcake.control.copies import ArenaCopy
from flatcake.control.index import PrefixHit, Segment
from flatcake.control.placement import Placement
from flatcake.readplan import ReadPlan


@dataclass(frozen=True, slots=True)
class StorePlan:
    """What the data plane must write for one turn.

    Attributes:
        session_id: the session written.
        segment: the segment to write, address allocated, *not yet published*.
        placement: the medium and the rule that chose it.
        first_block: request block index of the segment's position 0 (the hit prefix
            length): the segment holds request blocks ``[first_block, first_block +
            segment.num_blocks)``.
        file_base_offset: SSD only: the file's base in the node's SSD virtual space.
        span_bytes: SSD only: the file's span (the file never grows past it).
        new_file: SSD only: the file is new; create it first.
        copy: SSD only: a memory copy to write too (same blocks in the memory layout,
            in one or more arena extents: each of ``copy.pieces`` holds a run of the
            segment's blocks at its ``offset``), or ``None``.
        home: SSD only: a write-back (``ControlPlane.take_write_backs``): the not-yet
            memory home whose arena bytes (its memory layout, the same blocks) are
            written, not the engine's KV; ``None`` for a turn's store. The home stays
            allocated until this store completes.
    """

    session_id: str
    segment: Segment
    placement: Placement
    first_block: int
    file_base_offset: int | None = None
    span_bytes: int | None = None
    new_file: bool = False
    copy: ArenaCopy | None = None
    home: Segment | None = None

    @property
    def medium(self) -> Medium:
        return self.segment.medium

    @property
    def block_range(self) -> range:
        return range(self.first_block, self.first_block + self.segment.num_blocks)

    @property
    def file_id(self) -> int | None:
        return self.segment.file_id

    @property
    def file_offset(self) -> int | None:
        return self.segment.file_offset

    @property
    def arena_offset(self) -> int | None:
        """Memory only: where the segment goes in the host arena."""
        return self.segment.offset if self.segment.medium == Medium.MEMORY else None


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """A restore: the hit and its reads. Its sessions stay pinned until
    ``complete_load``.

    Attributes:
        request_id: the request restoring.
        hit: the prefix hit being restored.
        read_plan: per-layer SSD reads and arena copies.
        session_ids: sessions pinned by this restore.
        refills: ``(home, copy)`` pairs: SSD segments the restore reads whole and the
            memory copies allocated for them (``placement.copy_on_restore``); the data
            plane writes each copy from the restored bytes and names the homes it
            filled in ``complete_load``.
    """

    request_id: Hashable
    hit: PrefixHit
    read_plan: ReadPlan
    session_ids: frozenset[str]
    refills: tuple[tuple[Segment, ArenaCopy], ...] = ()


@dataclass(frozen=True, slots=True)
class FileCut:
    """A session file cut by ``truncate_session``: the data plane truncates it to
    ``end_bytes`` (the end of its last segment kept), so a restart never finds the
    segments that were cut off, and the next append lands there.

    Attributes:
        file_id: the session file.
        end_bytes: its new size (a 4 KiB multiple, at least the file header).
    """

    file_id: int
    end_bytes: int


@dataclass(frozen=True, slots=True)
class ReclaimAction:
    """A session (or part of it) dropped from the books; the data plane now deletes
    ``file_ids``, truncates ``cut_files`` and may reuse the arena ranges of
    ``memory_segments``.

    Attributes:
        session_id: the session.
        medium: the medium whose watermark triggered it; ``None`` for ``drop_session``
            and ``truncate_session``.
        memory_segments: memory segments and pieces of memory copies dropped (their
            arena ranges are free).
        ssd_segments: SSD segments dropped.
        file_ids: session files to delete.
        session_dropped: the session has nothing left and is forgotten.
        cut_files: session files to truncate (``truncate_session`` only).
        quarantine: move ``file_ids`` into ``quarantine/`` instead of deleting them
            (``settle_damage``: a damaged segment whose file header is damaged too).
    """

    session_id: str
    medium: Medium | None
    memory_segments: tuple[Segment, ...]
    ssd_segments: tuple[Segment, ...]
    file_ids: tuple[int, ...]
    session_dropped: bool
    cut_files: tuple[FileCut, ...] = ()
    quarantine: bool = False

    @property
    def memory_bytes(self) -> int:
        return sum(s.total_bytes for s in self.memory_segments)


@dataclass(frozen=True, slots=True)
class WindowRelease:
    """Window rows of an SSD segment that a newer turn superseded
    (``control.windows``): the books no longer serve them; the data plane punches
    ``pages`` out of the file.

    Attributes:
        segment_id: the segment (its layout lists the released layers).
        file_id: its session file.
        pages: ``(start, end)`` file offsets of whole 4 KiB pages to give back.
        layers: the layers this release released (no hit ends in the segment's
            blocks any more: KV events say so per layer kind).
    """

    segment_id: int
    file_id: int
    pages: tuple[tuple[int, int], ...]
    layers: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(end - start for start, end in self.pages)


@dataclass(frozen=True, slots=True)
class ControlStats:
    """A snapshot for ``flatcake inspect``, metrics and the simulator."""

    memory_used_bytes: int
    memory_capacity_bytes: int
    ssd_used_bytes: int
    ssd_capacity_bytes: int
    memory_high: float
    memory_low: float
    ssd_high: float
    ssd_low: float
    num_sessions: int
    num_pinned_sessions: int
    num_memory_segments: int
    num_ssd_segments: int
    num_files: int
    num_keys: int
    stores_in_flight: int
    loads_in_flight: int
    placements_by_rule: dict[str, int]
    sessions_reclaimed_memory: int
    sessions_reclaimed_ssd: int
    stores_rejected: int
    sessions_truncated: int = 0
    num_memory_copies: int = 0
    memory_copy_bytes: int = 0
    memory_copies_made: int = 0
    memory_copies_dropped: int = 0
    window_bytes_released: int = 0
    ssd_written_bytes: int = 0
    ssd_read_bytes: int = 0
    ssd_dropped_unread_bytes: int = 0
    ssd_unread_bytes: int = 0

    def status(self) -> dict[str, int]:
        """The figures ``flatcake serve --status`` shows of the books, by its names."""
        return {_STATUS_NAMES.get(f, f): getattr(self, f) for f in _STATUS}


# The fields ``ControlStats.status`` shows, in order, and the two it renames.
_STATUS = ("memory_used_bytes", "ssd_used_bytes", "num_sessions", "num_pinned_sessions",
           "stores_in_flight", "loads_in_flight", "ssd_written_bytes", "ssd_read_bytes",
           "ssd_dropped_unread_bytes", "ssd_unread_bytes", "sessions_reclaimed_ssd",
           "sessions_reclaimed_memory", "stores_rejected")
_STATUS_NAMES = {"num_sessions": "sessions", "num_pinned_sessions": "pinned_sessions"}

