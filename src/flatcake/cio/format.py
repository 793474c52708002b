"""Session file format (FC-CIO): one file per session span, a header, then turn segments.

A session file is named by its ``file_id`` only (``<file_id:016x>.fcs``); the session id
lives inside the header, so no caller-supplied string ever becomes a path component::

    file offset
    0      +---------------------------------------------+
           | file header (FILE_HEADER_BYTES = 4 KiB)      |
           |  magic "FLCKFILE" | version | header bytes   |
           |  file_id | node_id | virtual_base | span     |
           |  num_layers | block_bytes_per_layer          |
           |  session id (utf-8, length-prefixed)         |
           |  ... zero ...                  | header crc32 |
    4096   +---------------------------------------------+
           | segment 0 (turn 0)                           |  laid out by
           |   segment header (4 KiB multiple):           |  SegmentLayout.for_ssd
           |     magic "FLCKSEGM" | version | header bytes |
           |     file_id | seq | turn | first_block       |
           |     num_blocks | num_layers | block bytes    |
           |     data bytes | header crc32                 |
           |     key[0..num_blocks)      32 bytes each    |
           |     layer_crc[0..num_layers) 4 bytes each    |
           |     ... zero to 4 KiB ...                    |
           |   layer 0: block 0 .. n-1                    |
           |   layer 1: block 0 .. n-1                    |
           |   ...                                        |
           |   zero padding to 4 KiB                      |
           +---------------------------------------------+  4 KiB aligned
           | segment 1 (turn 1)                           |
           +---------------------------------------------+
           end of file = end of the last segment (nothing is preallocated)

All integers are little-endian. Each header crc32 covers the whole header with its own
crc field zeroed; ``layer_crc[l]`` covers layer ``l``'s data bytes (no padding). A
segment is valid only if its header crc, its size (fits in the file) and every layer
crc check out.

The file's size is its clean end (writers never preallocate). Anything else where a
segment should start is damage: a zeroed or corrupt header, a torn or corrupt segment,
zeros to the end of the file (a write interrupted by a crash, or lost data). The scan
then looks on, 4 KiB page by page, for later segments (valid header crc, this file's
id, a larger seq) to *count* them as lost with it. They are not served: the file is cut
at the damage (a later segment's blocks hang off the damaged turn's prefix), but no
intact turn disappears without being reported.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from flatcake.control.sessions import MAX_SESSION_ID_BYTES
from flatcake.plan.layout import (
    ALIGN,
    KEY_BYTES,
    SEGMENT_FIXED_HEADER_BYTES,
    SegmentLayout,
    segment_header_bytes,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
FILE_MAGIC = b"FLCKFILE"
SEGMENT_MAGIC = b"FLCKSEGM"
FILE_HEADER_BYTES = ALIGN
FILE_SUFFIX = ".fcs"

# magic, version, header_bytes, file_id, node_id, virtual_base, span_bytes,
# num_layers, block_bytes_per_layer, session_id_len
_FILE_FIXED = struct.Struct("<8sIIQIQQIQI")
_FILE_CRC_OFFSET = FILE_HEADER_BYTES - 4

# magic, version, header_bytes, file_id, seq, turn_index, first_block, num_blocks,
# num_layers, block_bytes_per_layer, data_bytes, header_crc
_SEG_FIXED = struct.Struct("<8sIIQQQQIIQQI")
_SEG_CRC_OFFSET = _SEG_FIXED.size - 4


class FormatError(ValueError):
    """Bytes that are not a valid FlatCake header (wrong magic, version, crc or field)."""


def _fast_crc32() -> Callable[[memoryview | bytes | bytearray, int], int]:
    """ISA-L's crc32 (``isal`` package, PCLMUL; same values as zlib's, ~2.8x faster on
    this box) when installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    return isal_zlib.crc32


_CRC32 = _fast_crc32()


def crc32(data: memoryview | bytes | bytearray, value: int = 0) -> int:
    """zlib's crc32 (releases the GIL on large buffers, so several threads can check
    several ranges at once)."""
    return _CRC32(data, value) & 0xFFFFFFFF


_CRC_POLY = 0xEDB88320  # reflected CRC-32 polynomial (zlib's)


def _gf2_times(matrix: tuple[int, ...], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def crc32_shift_operator(num_bytes: int) -> tuple[int, ...]:
    """The GF(2) matrix (32 columns) that appends ``num_bytes`` zero bytes to a crc32,
    so ``crc32(a + b) == apply(op(len(b)), crc32(a)) ^ crc32(b)`` (zlib's
    ``crc32_combine``, with the operator kept for reuse: combining chunks of one size
    then costs 32 xors each). Building one costs O(log num_bytes) matrix squarings."""
    if num_bytes < 0:
        raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
    one_bit = (_CRC_POLY, *(1 << n for n in range(31)))
    op: tuple[int, ...] = one_bit
    for _ in range(3):  # one zero byte = eight zero bits
        op = tuple(_gf2_times(op, c) for c in op)
    result = tuple(1 << n for n in range(32))  # identity
    n = num_bytes
    while n:
        if n & 1:
            result = tuple(_gf2_times(op, c) for c in result)
        op = tuple(_gf2_times(op, c) for c in op)
        n >>= 1
    return result


def crc32_combine(crc_a: int, crc_b: int, operator: tuple[int, ...]) -> int:
    """crc32 of ``a + b`` from crc32(a), crc32(b) and ``crc32_shift_operator(len(b))``."""
    return _gf2_times(operator, crc_a) ^ crc_b


def session_file_name(file_id: int) -> str:
    """The file name for ``file_id``: hex digits only, never caller-supplied text."""
    if not 0 <= file_id < (1 << 64):
        raise ValueError(f"file_id must be an unsigned 64-bit int, got {file_id!r}")
    return f"{file_id:016x}{FILE_SUFFIX}"


def parse_session_file_name(name: str) -> int | None:
    """``file_id`` of a session file name, or None if ``name`` is not one."""
    stem, dot, suffix = name.partition(".")
    if "." + suffix != FILE_SUFFIX or not dot or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class FileHeader:
    """The first 4 KiB of a session file.

    Attributes:
        session_id: the session this file belongs to (any text; never a path).
        file_id: unique per store; names the file.
        node_id: node whose SSD virtual space maps this file.
        virtual_base: offset of the file's span in that space (addresses of its blocks
            are ``virtual_base + file offset``), so addresses survive a restart.
        span_bytes: size of the span; the file never grows past it.
        num_layers: layers per block (geometry check on open).
        block_bytes_per_layer: bytes of one block of one layer (geometry check on open).
    """

    session_id: str
    file_id: int
    node_id: int
    virtual_base: int
    span_bytes: int
    num_layers: int
    block_bytes_per_layer: int

    def __post_init__(self) -> None:
        raw = self.session_id.encode("utf-8")
        if not raw or len(raw) > MAX_SESSION_ID_BYTES:
            raise ValueError(
                f"FileHeader.session_id must be 1..{MAX_SESSION_ID_BYTES} utf-8 bytes, got "
                f"{len(raw)} bytes"
            )
        for name in ("file_id", "virtual_base", "span_bytes", "block_bytes_per_layer"):
            value = getattr(self, name)
            if not 0 <= value < (1 << 64):
                raise ValueError(f"FileHeader.{name} must be an unsigned 64-bit int, got {value}")
        if not 0 <= self.node_id < (1 << 32):
            raise ValueError(f"FileHeader.node_id out of range, got {self.node_id}")
        if self.num_layers <= 0 or self.block_bytes_per_layer <= 0:
            raise ValueError(
                f"FileHeader geometry must be positive, got num_layers={self.num_layers} "
                f"block_bytes_per_layer={self.block_bytes_per_layer}"
            )


def encode_file_header(header: FileHeader) -> bytes:
    sid = header.session_id.encode("utf-8")
    buf = bytearray(FILE_HEADER_BYTES)
    _FILE_FIXED.pack_into(
        buf, 0, FILE_MAGIC, FORMAT_VERSION, FILE_HEADER_BYTES, header.file_id, header.node_id,
        header.virtual_base, header.span_bytes, header.num_layers,
        header.block_bytes_per_layer, len(sid),
    )
    buf[_FILE_FIXED.size:_FILE_FIXED.size + len(sid)] = sid
    struct.pack_into("<I", buf, _FILE_CRC_OFFSET, crc32(buf))
    return bytes(buf)


def decode_file_header(data: bytes | bytearray | memoryview) -> FileHeader:
    """Parse and check a file header; raise ``FormatError`` saying what is wrong."""
    if len(data) < FILE_HEADER_BYTES:
        raise FormatError(f"file header truncated: {len(data)} of {FILE_HEADER_BYTES} bytes")
    buf = bytearray(data[:FILE_HEADER_BYTES])
    (magic, version, header_bytes, file_id, node_id, base, span, num_layers, bbpl,
     sid_len) = _FILE_FIXED.unpack_from(buf, 0)
    if magic != FILE_MAGIC:
        raise FormatError(f"file header magic is {magic!r}, expected {FILE_MAGIC!r}")
    if version != FORMAT_VERSION:
        raise FormatError(f"file format version {version} is not supported")
    (stored,) = struct.unpack_from("<I", buf, _FILE_CRC_OFFSET)
    struct.pack_into("<I", buf, _FILE_CRC_OFFSET, 0)
    if crc32(buf) != stored:
        raise FormatError("file header crc32 mismatch")
    if header_bytes != FILE_HEADER_BYTES or sid_len > MAX_SESSION_ID_BYTES:
        raise FormatError(f"file header fields out of range (header_bytes={header_bytes})")
    sid = bytes(buf[_FILE_FIXED.size:_FILE_FIXED.size + sid_len]).decode("utf-8")
    try:
        return FileHeader(sid, file_id, node_id, base, span, num_layers, bbpl)
    except ValueError as exc:
        raise FormatError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """Self-describing header of one turn segment.

    Attributes:
        file_id: the file the segment was written into (a stale copy elsewhere fails).
        seq: position of the segment in its file; strictly increasing along the file
            (a stale segment left behind a rewritten tail does not pass for the next).
        turn_index: the session turn that wrote it.
        first_block: request block index of the segment's block 0 (the prefix length
            before it when it was written).
        num_blocks, num_layers, block_bytes_per_layer: the segment's geometry.
        keys: one 32-byte key per block, in block order.
        layer_crcs: crc32 of each layer's data bytes.
    """

    file_id: int
    seq: int
    turn_index: int
    first_block: int
    num_blocks: int
    num_layers: int
    block_bytes_per_layer: int
    keys: tuple[bytes, ...]
    layer_crcs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != self.num_blocks:
            raise ValueError(
                f"SegmentHeader.keys has {len(self.keys)} keys for num_blocks={self.num_blocks}"
            )
        for i, key in enumerate(self.keys):
            if len(key) != KEY_BYTES:
                raise ValueError(f"SegmentHeader.keys[{i}] must be {KEY_BYTES} bytes, "
                                 f"got {len(key)}")
        if len(self.layer_crcs) != self.num_layers:
            raise ValueError(
                f"SegmentHeader.layer_crcs has {len(self.layer_crcs)} entries for "
                f"num_layers={self.num_layers}"
            )

    @property
    def layout(self) -> SegmentLayout:
        return SegmentLayout.for_ssd(self.num_blocks, self.num_layers,
                                     self.block_bytes_per_layer)


def encode_segment_header(header: SegmentHeader) -> bytes:
    layout = header.layout
    buf = bytearray(layout.header_bytes)
    _SEG_FIXED.pack_into(
        buf, 0, SEGMENT_MAGIC, FORMAT_VERSION, layout.header_bytes, header.file_id,
        header.seq, header.turn_index, header.first_block, header.num_blocks,
        header.num_layers,
        header.block_bytes_per_layer, layout.data_bytes, 0,
    )
    pos = SEGMENT_FIXED_HEADER_BYTES
    for key in header.keys:
        buf[pos:pos + KEY_BYTES] = key
        pos += KEY_BYTES
    struct.pack_into(f"<{header.num_layers}I", buf, pos, *header.layer_crcs)
    struct.pack_into("<I", buf, _SEG_CRC_OFFSET, crc32(buf))
    return bytes(buf)


def segment_header_size(fixed: bytes | bytearray | memoryview) -> int:
    """Total header size claimed by the fixed part (so a reader knows how much to read).

    Raises ``FormatError`` if the fixed part is not a segment header.
    """
    if len(fixed) < _SEG_FIXED.size:
        raise FormatError(f"segment header truncated: {len(fixed)} bytes")
    magic, version, header_bytes, *_rest = _SEG_FIXED.unpack_from(fixed, 0)
    if magic != SEGMENT_MAGIC:
        raise FormatError(f"segment magic is {bytes(magic)!r}, expected {SEGMENT_MAGIC!r}")
    if version != FORMAT_VERSION:
        raise FormatError(f"segment format version {version} is not supported")
    if header_bytes <= 0 or header_bytes % ALIGN or header_bytes > (1 << 30):
        raise FormatError(f"segment header_bytes {header_bytes} is not a sane 4 KiB multiple")
    return int(header_bytes)


def decode_segment_header(data: bytes | bytearray | memoryview) -> SegmentHeader:
    """Parse and check a whole segment header; raise ``FormatError`` on any damage."""
    header_bytes = segment_header_size(data)
    if len(data) < header_bytes:
        raise FormatError(f"segment header truncated: {len(data)} of {header_bytes} bytes")
    buf = bytearray(data[:header_bytes])
    (_magic, _version, _hb, file_id, seq, turn_index, first_block, num_blocks, num_layers,
     bbpl, data_bytes, stored) = _SEG_FIXED.unpack_from(buf, 0)
    struct.pack_into("<I", buf, _SEG_CRC_OFFSET, 0)
    if crc32(buf) != stored:
        raise FormatError("segment header crc32 mismatch")
    if num_blocks <= 0 or num_layers <= 0 or bbpl <= 0:
        raise FormatError(f"segment geometry not positive: num_blocks={num_blocks} "
                          f"num_layers={num_layers} block_bytes_per_layer={bbpl}")
    if segment_header_bytes(num_blocks, num_layers) != header_bytes:
        raise FormatError(f"segment header_bytes {header_bytes} does not match its geometry")
    if data_bytes != num_blocks * num_layers * bbpl:
        raise FormatError(f"segment data_bytes {data_bytes} does not match its geometry")
    pos = SEGMENT_FIXED_HEADER_BYTES
    keys = tuple(bytes(buf[pos + i * KEY_BYTES:pos + (i + 1) * KEY_BYTES])
                 for i in range(num_blocks))
    pos += num_blocks * KEY_BYTES
    crcs = struct.unpack_from(f"<{num_layers}I", buf, pos)
    return SegmentHeader(file_id, seq, turn_index, first_block, num_blocks, num_layers,
                         bbpl, keys, tuple(crcs))


def compute_layer_crcs(segment_data: memoryview | bytes | bytearray,
                       layout: SegmentLayout) -> tuple[int, ...]:
    """crc32 of each layer of a segment's data region (``segment_data`` starts at the
    data offset, i.e. layer 0 block 0)."""
    mv = memoryview(segment_data).cast("B")
    return tuple(
        crc32(mv[layer * layout.layer_bytes:(layer + 1) * layout.layer_bytes])
        for layer in range(layout.num_layers)
    )


@dataclass(frozen=True, slots=True)
class ScannedSegment:
    """A segment that passed every check, at ``file_offset`` in its file."""

    file_offset: int
    header: SegmentHeader

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
            try:
                seg = _segment_at(fd, offset)
                seq = seg.seq
                reason = _check_segment(fd, offset, seg, header, file_bytes, segments,
                                        verify_data, chunk_bytes)
            except FormatError as exc:
                reason = str(exc)
            if not reason:
                segments.append(ScannedSegment(offset, seg))
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


def _check_segment(fd: int, offset: int, seg: SegmentHeader, header: FileHeader,
                   file_bytes: int, previous: list[ScannedSegment], verify_data: bool,
                   chunk_bytes: int) -> str:
    """Why the segment at ``offset`` is not servable, or "" if it is."""
    layout = seg.layout
    if seg.file_id != header.file_id:
        return f"segment file_id {seg.file_id} != file header's {header.file_id}"
    if (seg.num_layers, seg.block_bytes_per_layer) != (
            header.num_layers, header.block_bytes_per_layer):
        return "segment geometry differs from the file's"
    if offset + layout.total_bytes > min(file_bytes, header.span_bytes):
        return (f"segment is torn: needs {layout.total_bytes} bytes, file has "
                f"{file_bytes - offset} after its start")
    if previous and seg.seq <= previous[-1].header.seq:
        return f"segment seq {seg.seq} does not follow seq {previous[-1].header.seq}"
    if not verify_data:
        return ""
    base = offset + layout.data_offset
    for layer in range(layout.num_layers):
        crc = 0
        start, end = base + layer * layout.layer_bytes, base + (layer + 1) * layout.layer_bytes
        while start < end:
            chunk = _read_exact(fd, start, min(chunk_bytes, end - start))
            if not chunk:
                return f"segment is torn at layer {layer}"
            crc = crc32(chunk, crc)
            start += len(chunk)
        if crc != seg.layer_crcs[layer]:
            return f"layer {layer} crc32 mismatch"
    return ""
