"""Scanning one session file (``cio.format``): its header, the valid segments in file
order, and where the walk stopped and why.

A segment is valid only if its header crc, its size (it fits in the file) and, with
``verify_data``, every layer crc check out. The file's size is its clean end; anything
else where a segment should start is damage. Past damage the scan looks on, 4 KiB page
by page, for later segments of this file (valid header crc, this file's id, a larger
seq) to *count* them as lost with it (``DamagedSegment.lost_segments``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from flatcake.cio.crc import crc32
from flatcake.cio.format import (
    FILE_HEADER_BYTES,
    SEGMENT_MAGIC,
    FileHeader,
    FormatError,
    SegmentHeader,
    decode_file_header,
    decode_segment_header,
    segment_header_size,
)
from flatcake.cio.holes import is_hole
from flatcake.control.windows import window_layers, window_pages
from flatcake.layout import ALIGN, SegmentLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScannedSegment:
    """A segment that passed every check, at ``file_offset`` in its file; ``released``:
    its windowed layers whose rows were punched out (``cio.holes``)."""

    file_offset: int
    header: SegmentHeader
    released: tuple[int, ...] = ()

    @property
    def layout(self) -> SegmentLayout:
        """Its layout, with the released layers holding none of their rows."""
        lay = self.header.layout
        return lay.release(self.released) if self.released else lay

    @property
    def end_offset(self) -> int:
        return self.file_offset + self.header.layout.total_bytes


@dataclass(frozen=True, slots=True)
class DamagedSegment:
    """Where a scan stopped and why. ``seq`` is known when the header itself was valid;
    ``lost_segments`` counts the valid segments found after the damage (dropped with
    it when the file is cut there)."""

    file_offset: int
    reason: str
    seq: int | None = None
    lost_segments: int = 0


def _read_exact(fd: int, offset: int, length: int) -> bytes:
    out = bytearray()
    while len(out) < length:
        chunk = os.pread(fd, length - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def scan_session_file(
    path: str | os.PathLike[str], verify_data: bool = True,
    chunk_bytes: int = 16 << 20,
) -> tuple[FileHeader, list[ScannedSegment], list[DamagedSegment]]:
    """Walk a session file and return its header, its valid segments in order, and the
    damaged segment where the walk stopped (at most one entry; see the module docstring
    for clean end versus damage, and ``DamagedSegment.lost_segments``).

    ``verify_data=False`` checks headers and sizes only (fast restart); layer crcs are
    then verified when the data is read. Raises ``FormatError`` if the file header
    itself is damaged (the whole file is unusable).
    """
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        file_bytes = os.fstat(fd).st_size
        header = decode_file_header(_read_exact(fd, 0, FILE_HEADER_BYTES))
        end = min(file_bytes, header.span_bytes)
        segments: list[ScannedSegment] = []
        damaged: list[DamagedSegment] = []
        offset = FILE_HEADER_BYTES
        while offset < end:
            seq = None
            released: tuple[int, ...] = ()
            try:
                seg = _segment_at(fd, offset)
                seq = seg.seq
                released = _released(fd, offset, seg.layout)
                reason = _check_segment(fd, offset, seg, header, file_bytes, segments,
                                        verify_data, chunk_bytes, released)
            except FormatError as exc:
                reason = str(exc)
            if not reason:
                segments.append(ScannedSegment(offset, seg, released))
                offset += seg.layout.total_bytes
                continue
            last_seq = segments[-1].header.seq if segments else -1
            lost, zeros = _look_past(fd, offset, header, end, last_seq)
            if zeros:
                reason = "zeros to the end of the file (an interrupted write, or lost data)"
            if lost:
                reason += f"; followed by {lost} valid segments, cut off with it"
            damaged.append(DamagedSegment(offset, reason, seq, lost))
            break
        for d in damaged:
            logger.warning("session file %s: segment at offset %d damaged: %s",
                           os.fspath(path), d.file_offset, d.reason)
        return header, segments, damaged
    finally:
        os.close(fd)


def segment_at(path: str | os.PathLike[str], offset: int) -> SegmentHeader:
    """The header of the segment at ``offset`` of the session file ``path`` (buffered
    reads: headers are small and read once). Raises ``OSError`` / ``FormatError``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _segment_at(fd, offset)
    finally:
        os.close(fd)


def _segment_at(fd: int, offset: int) -> SegmentHeader:
    first = _read_exact(fd, offset, ALIGN)
    size = segment_header_size(first)
    return decode_segment_header(first if size == ALIGN else _read_exact(fd, offset, size))


def _look_past(fd: int, offset: int, header: FileHeader, end: int,
               last_seq: int) -> tuple[int, bool]:
    """After a bad spot at ``offset``: (valid segments found later, whether everything
    from ``offset`` to ``end`` is zero). Later segments are found by their magic on a
    4 KiB page, then must pass the header crc, carry this file's id, follow ``last_seq``
    and fit in the file; each one found is followed by its length."""
    lost, zero, pos = 0, True, offset
    step = 1 << 20
    while pos < end:
        chunk = _read_exact(fd, pos, min(step, end - pos))
        if not chunk:
            break
        if zero and chunk.count(0) != len(chunk):
            zero = False
        hit = chunk.find(SEGMENT_MAGIC)
        next_pos = pos + len(chunk)
        while hit >= 0:
            at = pos + hit
            if at % ALIGN == 0 and at > offset:
                try:
                    seg = _segment_at(fd, at)
                except FormatError:
                    seg = None
                if seg is not None and seg.file_id == header.file_id and \
                        seg.seq > last_seq and at + seg.layout.total_bytes <= end:
                    lost += 1
                    last_seq = seg.seq
                    next_pos = at + seg.layout.total_bytes
                    zero = False
                    break
            hit = chunk.find(SEGMENT_MAGIC, hit + 1)
        pos = next_pos
    return lost, zero


def _released(fd: int, offset: int, layout: SegmentLayout) -> tuple[int, ...]:
    """The windowed layers of the segment at ``offset`` whose rows were released: the
    first whole page of their window's rows is a hole (``control.windows``)."""
    if not layout.layer_window_blocks:
        return ()
    out: list[int] = []
    for w, _ in window_layers(layout.layer_window_blocks):
        pages = window_pages(layout, w)
        if pages and offset + pages[0][1] <= os.fstat(fd).st_size and \
                is_hole(fd, offset + pages[0][0]):
            out += [k for k, kw in enumerate(layout.layer_window_blocks) if kw == w]
    return tuple(sorted(out))


def _check_segment(fd: int, offset: int, seg: SegmentHeader, header: FileHeader,
                   file_bytes: int, previous: list[ScannedSegment], verify_data: bool,
                   chunk_bytes: int, released: tuple[int, ...] = ()) -> str:
    """Why the segment at ``offset`` is not servable, or "" if it is (the rows of
    ``released`` layers are not checked: they are gone)."""
    layout = seg.layout
    if seg.file_id != header.file_id:
        return f"segment file_id {seg.file_id} != file header's {header.file_id}"
    if (seg.layer_block_bytes, seg.layer_window_blocks) != \
            (header.layer_block_bytes, header.layer_window_blocks):
        return "segment geometry differs from the file's"
    if offset + layout.total_bytes > min(file_bytes, header.span_bytes):
        return (f"segment is torn: needs {layout.total_bytes} bytes, file has "
                f"{file_bytes - offset} after its start")
    if previous and seg.seq <= previous[-1].header.seq:
        return f"segment seq {seg.seq} does not follow seq {previous[-1].header.seq}"
    if not verify_data:
        return ""
    for layer in range(layout.num_layers):
        if layer in released:
            continue
        crc = 0
        start = offset + layout.layer_offset(layer)
        end = start + layout.layer_bytes(layer)
        while start < end:
            chunk = _read_exact(fd, start, min(chunk_bytes, end - start))
            if not chunk:
                return f"segment is torn at layer {layer}"
            crc = crc32(chunk, crc)
            start += len(chunk)
        if crc != seg.layer_crcs[layer]:
            return f"layer {layer} crc32 mismatch"
    return ""
