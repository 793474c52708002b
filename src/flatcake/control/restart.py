"""Restart: rebuild the books from what a scan of the session files found.

The scan itself (reading headers, checking crcs, moving or cutting files) is the data
plane's; here the decoded headers become books again (``recover_segment``), no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from flatcake.control.address import Medium, encode_address
from flatcake.control.books import _Books
from flatcake.control.index import Segment
from flatcake.control.keys import check_keys
from flatcake.control.sessions import SessionRecord, check_session_id
from flatcake.plan.layout import SegmentLayout


class _Restart(_Books):
    """Re-indexing scanned segments for ``ControlPlane``."""

    def reserve_file_id(self, file_id: int) -> None:
        """A session file ``file_id`` exists on disk (served, stray or quarantined):
        the books never hand its id out for a new file."""
        self.ssd.reserve_file_id(file_id)

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
        g = self.geometry
        if layout.num_layers != g.num_layers or \
                layout.block_bytes_per_layer != g.block_bytes_per_layer:
            raise ValueError(
                f"layout {layout.num_layers}x{layout.block_bytes_per_layer} B does not match "
                f"geometry {g.num_layers}x{g.block_bytes_per_layer} B"
            )
        key_tuple = tuple(keys)
        check_keys(key_tuple, 0)
        known_file = file_id in self.ssd.files_of(session_id)
        ext = self.ssd.adopt_extent(session_id, file_id, file_offset, layout.total_bytes,
                                    virtual_base)
        segment = Segment(self._next_segment_id, session_id, Medium.SSD,
                          encode_address(Medium.SSD, self.node_id, ext.offset), layout,
                          key_tuple, turn_index, file_id, file_offset)
        self._next_segment_id += 1
        self.index.publish(segment)
        when = self.clock.now() if last_access is None else last_access
        rec = self._sessions.get(session_id)
        if rec is None:
            rec = self._sessions[session_id] = SessionRecord(session_id, when)
        rec.last_access = max(rec.last_access, when)
        rec.ssd_segment_ids.append(segment.segment_id)
        rec.ssd_bytes += ext.size_bytes + (0 if known_file else self.ssd.file_header_bytes)
        return segment
