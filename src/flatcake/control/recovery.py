"""What a scan of the session files found, and what the books decide about each file:
the value types of ``control.restart`` (no I/O).

The header types are protocols: ``cio.format``'s ``FileHeader`` and ``cio.filescan``'s
``ScannedSegment`` and ``DamagedSegment`` satisfy them as they are.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from flatcake.layout import SegmentLayout


class FileHeaderView(Protocol):
    """A session file's decoded header (``cio.format.FileHeader``)."""

    @property
    def session_id(self) -> str: ...
    @property
    def file_id(self) -> int: ...
    @property
    def virtual_base(self) -> int: ...
    @property
    def span_bytes(self) -> int: ...
    @property
    def layer_block_bytes(self) -> tuple[int, ...]: ...
    @property
    def layer_window_blocks(self) -> tuple[int, ...]: ...


class SegmentHeaderView(Protocol):
    """A segment's decoded header (``cio.format.SegmentHeader``)."""

    @property
    def seq(self) -> int: ...
    @property
    def turn_index(self) -> int: ...
    @property
    def first_block(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def keys(self) -> tuple[bytes, ...]: ...
    @property
    def layer_crcs(self) -> tuple[int, ...]: ...
    @property
    def block_crcs(self) -> tuple[tuple[int, ...], ...] | None: ...
    @property
    def layout(self) -> SegmentLayout: ...


class SegmentView(Protocol):
    """A segment that passed the scan (``cio.filescan.ScannedSegment``); ``layout``
    is its header's, with the window rows found released."""

    @property
    def file_offset(self) -> int: ...
    @property
    def header(self) -> SegmentHeaderView: ...
    @property
    def layout(self) -> SegmentLayout: ...
    @property
    def end_offset(self) -> int: ...


class DamageView(Protocol):
    """Where a scan stopped (``cio.format.DamagedSegment``)."""

    @property
    def reason(self) -> str: ...
    @property
    def lost_segments(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ScannedFile:
    """One session file as the data plane's scan decoded it.

    Attributes:
        file_id: the id in the file's name.
        header: its header, ``None`` when unreadable.
        segments: the valid segments, in file order.
        damage: where the scan stopped on damage (at most one entry in practice).
        age_s: seconds since the file was last written (orders reclaim).
        name: how messages name it (e.g. its path).
        error: why the header is unreadable (with ``header=None``).
    """

    file_id: int
    header: FileHeaderView | None
    segments: Sequence[SegmentView] = ()
    damage: Sequence[DamageView] = ()
    age_s: float = 0.0
    name: str = ""
    error: str = ""


class FileFate(enum.Enum):
    KEEP = "keep"  # trimmed to end_bytes (cut there when cut=True)
    DELETE = "delete"  # nothing servable left in it
    QUARANTINE = "quarantine"  # unreadable or a stray: moved aside, never served


@dataclass(frozen=True, slots=True)
class FileVerdict:
    """What the data plane does with one scanned file.

    Attributes:
        file_id: the file.
        fate: keep, delete or quarantine it.
        reason: why (quarantine, damage), empty for a clean file.
        session_id: the session its header names ("" when unreadable).
        end_bytes: KEEP: the file's end after its last kept segment.
        cut: KEEP: damage was cut off (the file is truncated at ``end_bytes``).
        segment_ids: the segments re-indexed, in file order.
        num_blocks: their blocks.
        num_damaged: damaged segments (scan damage, or a segment the books refused).
        num_lost: valid segments past the damage, cut off with it.
    """

    file_id: int
    fate: FileFate
    reason: str = ""
    session_id: str = ""
    end_bytes: int = 0
    cut: bool = False
    segment_ids: tuple[int, ...] = ()
    num_blocks: int = 0
    num_damaged: int = 0
    num_lost: int = 0


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover_files`` did to the books and asks of the data plane.

    Attributes:
        files: one verdict per scanned file, in the order given.
        crcs: each re-indexed segment's layer crcs, by segment id.
    """

    files: tuple[FileVerdict, ...]
    crcs: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def num_files(self) -> int:
        return len(self.files)

    @property
    def num_sessions(self) -> int:
        """Sessions with at least one segment re-indexed."""
        return len({v.session_id for v in self.files if v.segment_ids})

    @property
    def num_segments(self) -> int:
        return sum(len(v.segment_ids) for v in self.files)

    @property
    def num_blocks(self) -> int:
        return sum(v.num_blocks for v in self.files)

    @property
    def num_damaged(self) -> int:
        return sum(v.num_damaged for v in self.files)

    @property
    def num_lost(self) -> int:
        return sum(v.num_lost for v in self.files)

    @property
    def num_quarantined(self) -> int:
        return sum(1 for v in self.files if v.fate == FileFate.QUARANTINE)

    @property
    def damaged_file_ids(self) -> tuple[int, ...]:
        """Files quarantined or with damage cut off, sorted."""
        return tuple(sorted(v.file_id for v in self.files
                            if v.fate == FileFate.QUARANTINE or v.num_damaged))
