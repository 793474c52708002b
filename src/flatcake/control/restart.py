"""Restart: rebuild the books from what a scan of the session files found. No I/O.

The data plane scans (reads headers, checks crcs) and hands each file's decoded headers
over as a ``ScannedFile``; ``recover_files`` re-indexes them and decides, per file,
what the data plane must then do on disk (``FileVerdict``)::

    header unreadable, or a stray (names another file id; or another geometry or
    span, while some other file matches the geometry)    -> QUARANTINE
    valid segments, then damage (found by the scan, or a
    segment the books refuse, e.g. a key repeated in it)  -> KEEP, cut after the last
                                                             segment re-indexed
    no segment re-indexed                                 -> DELETE
    clean                                                 -> KEEP up to its last segment

Only a set of files where *none* matches the geometry is refused (``ValueError``): the
store was opened with the wrong model, and nothing may be touched. The same decisions
serve every host: the store's open path and ``fsck --repair``, and both halves of the
vLLM connector (the worker half runs them on a scratch ``ControlPlane`` of its own
geometry, so it keeps the same files and segments the scheduler half serves).

The value types (``ScannedFile`` in, ``Recovery`` out) are ``control.recovery``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from flatcake.clock import Clock
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import BlockIndex, Segment
from flatcake.control.keys import check_keys
from flatcake.control.recovery import (
    FileFate,
    FileHeaderView,
    FileVerdict,
    Recovery,
    ScannedFile,
    SegmentView,
)
from flatcake.control.sessions import SegmentIds, SessionTable, check_session_id
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.windows import released_bytes
from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout, describe_layers


class Restart:
    """Re-indexing scanned segments (the verbs behind ``ControlPlane.recover_*``).

    Owns no state of its own. Writes the parts it is given: the SSD space (adopted
    extents, reserved file ids), the index (publish), session records and the table (new
    sessions), segment ids.
    """

    def __init__(self, geometry: KVGeometry, clock: Clock, node_id: int, index: BlockIndex,
                 ssd: SsdSpace, sessions: SessionTable, ids: SegmentIds) -> None:
        self._geometry = geometry
        self._clock = clock
        self._node_id = node_id
        self._index = index
        self._ssd = ssd
        self._sessions = sessions
        self._ids = ids

    def reserve_file_id(self, file_id: int) -> None:
        """A session file ``file_id`` exists on disk (served, stray or quarantined):
        the books never hand its id out for a new file."""
        self._ssd.reserve_file_id(file_id)

    def recover_segment(self, session_id: str, file_id: int, file_offset: int,
                        layout: SegmentLayout, keys: Sequence[bytes], turn_index: int, *,
                        virtual_base: int | None = None,
                        last_access: float | None = None) -> Segment:
        """Restart: re-index a valid segment found by scanning a session file.

        ``virtual_base`` (the base recorded in the file header) keeps the file at its old
        span when that span is free. ``last_access`` (e.g. the file's mtime on this
        clock) orders reclaim; default now. Segments are published at once: the scan
        has verified their checksums.
        """
        check_session_id(session_id)
        g = self._geometry
        if layout.layer_block_bytes != g.layer_block_bytes or \
                layout.layer_window_blocks != g.layer_window_blocks:
            raise ValueError(
                f"layout {describe_layers(layout.layer_block_bytes, layout.layer_window_blocks)}"
                f" does not match geometry "
                f"{describe_layers(g.layer_block_bytes, g.layer_window_blocks)}"
            )
        key_tuple = tuple(keys)
        check_keys(key_tuple, 0)
        known_file = file_id in self._ssd.files_of(session_id)
        ext = self._ssd.adopt_extent(session_id, file_id, file_offset, layout.total_bytes,
                                    virtual_base)
        punched = released_bytes(layout)  # punched before: the file holds the rest
        if punched:
            self._ssd.punch(file_id, file_offset, punched)
        # The id is drawn once the segment is built (a header the books refuse here
        # takes none).
        segment = Segment(self._ids.upcoming, session_id, Medium.SSD,
                          encode_address(Medium.SSD, self._node_id, ext.offset), layout,
                          key_tuple, turn_index, file_id, file_offset)
        self._ids.take()
        self._index.publish(segment)
        when = self._clock.now() if last_access is None else last_access
        rec = self._sessions.get(session_id)
        if rec is None:
            rec = self._sessions.create(session_id, when)
        rec.last_access = max(rec.last_access, when)
        rec.add_segment(segment)
        rec.ssd_bytes += ext.size_bytes - punched + (0 if known_file
                                                     else self._ssd.file_header_bytes)
        return segment

    def recover_files(self, scans: Sequence[ScannedFile], *,
                      other_file_ids: Iterable[int] = (),
                      mismatch: Literal["quarantine", "refuse"] = "quarantine") -> Recovery:
        """Re-index every valid segment of ``scans`` and decide each file's fate (see
        the module docstring); the data plane then acts on ``Recovery.files``.

        ``other_file_ids`` are files on disk that are not scanned (e.g. already in
        quarantine): their ids, like the scanned ones, are never handed out again.
        ``mismatch="refuse"`` raises ``ValueError`` on any file of another geometry or
        span instead of quarantining it. Raises ``ValueError`` before touching the books
        when no readable file matches the geometry.
        """
        g, span = self._geometry, self._ssd.span_bytes

        def fits(h: FileHeaderView) -> bool:
            return (h.layer_block_bytes, h.layer_window_blocks, h.span_bytes) == \
                (g.layer_block_bytes, g.layer_window_blocks, span)

        if mismatch not in ("quarantine", "refuse"):
            raise ValueError(f"mismatch must be 'quarantine' or 'refuse', got {mismatch!r}")
        readable = [(s, s.header) for s in scans if s.header is not None]
        misfits = [(s, h) for s, h in readable if not fits(h)]
        if misfits and (len(misfits) == len(readable) or mismatch == "refuse"):
            bad, h = misfits[0]
            if h.span_bytes != span:
                raise ValueError(f"store.session_file_bytes={span} but session file "
                                 f"{bad.name or bad.file_id} was written with span "
                                 f"{h.span_bytes}")
            raise ValueError(
                f"session file {bad.name or bad.file_id} holds "
                f"{describe_layers(h.layer_block_bytes, h.layer_window_blocks)} blocks, "
                f"but geometry {g.name!r} has "
                f"{describe_layers(g.layer_block_bytes, g.layer_window_blocks)}")
        for file_id in (*(s.file_id for s in scans), *other_file_ids):
            self.reserve_file_id(file_id)
        now = self._clock.now()
        crcs: dict[int, tuple[int, ...]] = {}
        verdicts: list[FileVerdict] = []
        for scan in scans:
            head = scan.header
            if head is None:
                why = f"unreadable ({scan.error})" if scan.error else "unreadable"
                verdicts.append(FileVerdict(scan.file_id, FileFate.QUARANTINE, why))
            elif head.file_id != scan.file_id or not fits(head):
                verdicts.append(FileVerdict(
                    scan.file_id, FileFate.QUARANTINE,
                    f"a stray: its header names file id {head.file_id}, "
                    f"{describe_layers(head.layer_block_bytes)}, span {head.span_bytes}",
                    head.session_id))
            else:
                verdicts.append(self._recover_file(scan, head, now - max(0.0, scan.age_s),
                                                   crcs))
        return Recovery(tuple(verdicts), crcs)

    def _recover_file(self, scan: ScannedFile, h: FileHeaderView, last_access: float,
                      crcs: dict[int, tuple[int, ...]]) -> FileVerdict:
        """Re-index one file's segments in order; a segment the books refuse is damage
        like the scan's (the file is cut before it, the segments after it are lost)."""
        kept: list[SegmentView] = []
        ids: list[int] = []
        blocks = 0
        reason = "; ".join(d.reason for d in scan.damage)
        num_damaged = len(scan.damage)
        num_lost = sum(d.lost_segments for d in scan.damage)
        for scanned in scan.segments:
            sh = scanned.header
            try:
                seg = self.recover_segment(
                    h.session_id, scan.file_id, scanned.file_offset, scanned.layout, sh.keys,
                    sh.turn_index, virtual_base=h.virtual_base, last_access=last_access)
            except ValueError as exc:  # e.g. a key repeated in it (an older version)
                reason, num_damaged = f"refused: {exc}", 1
                num_lost = len(scan.segments) - len(kept) - 1
                break
            crcs[seg.segment_id] = sh.layer_crcs
            kept.append(scanned)
            ids.append(seg.segment_id)
            blocks += sh.num_blocks
        if not kept:
            return FileVerdict(scan.file_id, FileFate.DELETE, reason, h.session_id,
                               num_damaged=num_damaged, num_lost=num_lost)
        return FileVerdict(scan.file_id, FileFate.KEEP, reason, h.session_id,
                           kept[-1].end_offset, num_damaged > 0,
                           tuple(ids), blocks, num_damaged, num_lost)
