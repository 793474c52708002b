"""Per-session books kept by the control plane (no I/O): the records, the table that
holds them and the segment id count.

A session owns its segments (in memory and on SSD), its SSD files and the memory
copies of some of its SSD segments. Reclaim takes sessions oldest ``last_access``
first, and never one with ``num_pins > 0`` (a restore is reading it, or one of its
writes is still in flight); see ``control.ControlPlane`` for the units it drops.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Sequence
from dataclasses import dataclass, field

from flatcake.control.address import Medium
from flatcake.control.index import Segment
from flatcake.control.ssd_space import SsdSpace

MAX_SESSION_ID_BYTES = 2048  # UTF-8 bytes; the session file header holds the id


def check_session_id(session_id: object, field_name: str = "session_id") -> str:
    """Return ``session_id`` if it is a non-empty str; else raise ``ValueError``.

    Session ids are arbitrary text: they are never used as path components (files are
    named by ``file_id``)."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"{field_name} must be a non-empty str, got {session_id!r}")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field_name} must be valid text (UTF-8 encodable), got "
                         f"{session_id[:64]!r}: {exc.reason}") from None
    if size > MAX_SESSION_ID_BYTES:
        raise ValueError(f"{field_name} must be at most {MAX_SESSION_ID_BYTES} UTF-8 bytes "
                         f"(it is stored in the session file header), got {size}")
    return session_id


@dataclass(slots=True)
class SessionRecord:
    """Books of one session (mutable; held by the ``SessionTable``).

    Attributes:
        session_id: the session.
        last_access: clock time of the last store, load or touch.
        num_pins: active restores reading the session plus writes in flight into it.
        memory_segment_ids: published memory segments, oldest first.
        ssd_segment_ids: published SSD segments, oldest first.
        memory_bytes: arena bytes held (published and in-flight writes).
        ssd_bytes: SSD bytes held: segments (published and in-flight writes) plus the
            4 KiB header of each of its session files.
        copy_ids: SSD segments (ids) that also have a published memory copy.
        copy_bytes: arena bytes held by memory copies (published and in-flight writes);
            not in ``memory_bytes``, which counts segments whose home is memory.
        turns: live (published) segments by turn index, both media.
        newest_turn: the largest key of ``turns``, -1 when it is empty: asked on every
            lookup that hits the session (``control.signals.hit_owner``), so kept here
            rather than found by a scan of a long agent session's segments.

    The segment lists, ``turns`` and ``newest_turn`` change together, through
    ``add_segment`` and ``remove_segments`` only.
    """

    session_id: str
    last_access: float
    num_pins: int = 0
    memory_segment_ids: list[int] = field(default_factory=list)
    ssd_segment_ids: list[int] = field(default_factory=list)
    memory_bytes: int = 0
    ssd_bytes: int = 0
    copy_ids: list[int] = field(default_factory=list)
    copy_bytes: int = 0
    turns: dict[int, int] = field(default_factory=dict)
    newest_turn: int = -1

    def bytes_on(self, medium: Medium) -> int:
        return self.memory_bytes if medium == Medium.MEMORY else self.ssd_bytes

    def segment_ids_on(self, medium: Medium) -> list[int]:
        return self.memory_segment_ids if medium == Medium.MEMORY else self.ssd_segment_ids

    @property
    def num_segments(self) -> int:
        return len(self.memory_segment_ids) + len(self.ssd_segment_ids)

    def add_segment(self, seg: Segment) -> None:
        """``seg``, one of this session's, is published (the newest of its medium)."""
        self.segment_ids_on(seg.medium).append(seg.segment_id)
        turn = seg.turn_index
        self.turns[turn] = self.turns.get(turn, 0) + 1
        if turn > self.newest_turn:
            self.newest_turn = turn

    def remove_segments(self, segs: Sequence[Segment]) -> None:
        """``segs``, published segments of this session, are no longer."""
        if not segs:
            return
        gone = {s.segment_id for s in segs}
        if any(s.medium is Medium.MEMORY for s in segs):
            self.memory_segment_ids = [i for i in self.memory_segment_ids if i not in gone]
        if any(s.medium is not Medium.MEMORY for s in segs):
            self.ssd_segment_ids = [i for i in self.ssd_segment_ids if i not in gone]
        turns = self.turns
        for seg in segs:
            left = turns[seg.turn_index] - 1
            if left:
                turns[seg.turn_index] = left
            else:
                del turns[seg.turn_index]
        if self.newest_turn not in turns:  # its last segment went (a cut, a reclaim)
            self.newest_turn = max(turns, default=-1)


class SessionTable:
    """The session records of one control plane, by session id.

    Owns the table: records are added by ``create`` (a first store, or a re-indexed
    segment) and leave by ``forget_if_empty`` only. Their fields are written by the verbs
    that change what they count (``stores``, ``loads``, ``spare``, ``reclaimer``,
    ``restart``), each field described on ``SessionRecord``.
    """

    __slots__ = ("_records", "_ssd", "get", "values")

    def __init__(self, ssd: SsdSpace) -> None:
        self._records: dict[str, SessionRecord] = {}
        self._ssd = ssd
        # The verbs ask these on every call: the dict's own methods, no wrapper.
        self.get = self._records.get
        self.values = self._records.values

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._records

    def __getitem__(self, session_id: str) -> SessionRecord:
        """The record of a session the books hold (plain ``KeyError`` otherwise)."""
        return self._records[session_id]

    def items(self) -> ItemsView[str, SessionRecord]:
        return self._records.items()

    def session(self, session_id: str) -> SessionRecord:
        """The record of a session (``KeyError`` naming it when unknown)."""
        try:
            return self._records[session_id]
        except KeyError:
            raise KeyError(f"unknown session_id {session_id!r}") from None

    def create(self, session_id: str, last_access: float) -> SessionRecord:
        """A record for a session the table does not hold yet."""
        rec = self._records[session_id] = SessionRecord(session_id, last_access)
        return rec

    def forget_if_empty(self, rec: SessionRecord) -> bool:
        """Drop ``rec`` when nothing pins it and it holds no segment and no file."""
        if rec.num_pins == 0 and rec.num_segments == 0 and not self._ssd.files_of(
                rec.session_id):
            self._records.pop(rec.session_id, None)
            return True
        return False


class SegmentIds:
    """The segment ids of one control plane, handed out in order: segments, memory copies
    and re-indexed segments draw from the same count, so no two ever share an id."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    @property
    def upcoming(self) -> int:
        """The id ``take`` returns next."""
        return self._next

    def take(self) -> int:
        n = self._next
        self._next = n + 1
        return n
