"""Session file format (FC-CIO): one file per session span, a header, then turn segments.

A session file is named by its ``file_id`` only (``<file_id:016x>.fcs``); the session id
lives inside the header, so no caller-supplied string ever becomes a path component::

    file offset
    0      +---------------------------------------------+
           | file header (FILE_HEADER_BYTES = 4 KiB)      |
           |  magic "FLCKFILE" | version | header bytes   |
           |  file_id | node_id | virtual_base | span     |
           |  num_layers | block_bytes_per_layer (0: mixed)|
           |  session id (utf-8, length-prefixed)         |
           |  [mixed] block bytes of each layer, 4 each   |
           |  [v3] window blocks of each layer, 4 each    |
           |  ... zero ...                  | header crc32 |
    4096   +---------------------------------------------+
           | segment 0 (turn 0)                           |  laid out by
           |   segment header (4 KiB multiple):           |  SegmentLayout.for_ssd
           |     magic "FLCKSEGM" | version | header bytes |
           |     file_id | seq | turn | first_block       |
           |     num_blocks | num_layers | block bytes    |
           |     data bytes | header crc32                 |
           |     [v5] mark (branch block), 4 bytes        |
           |     [v6] number of hit-end runs, 4 bytes     |
           |     key[0..num_blocks)      32 bytes each    |
           |     layer_crc[0..num_layers) 4 bytes each    |
           |     [mixed] layer block bytes, 4 bytes each  |
           |     [v3] layer window blocks, 4 bytes each   |
           |     [v4] layer window blocks (0s: none),     |
           |     [v6] hit-end runs (lo, hi), 8 bytes each,|
           |     [v4] block_crc[layer][row], 4 bytes each |
           |     ... zero to 4 KiB ...                    |
           |   layer 0: block 0 .. n-1                    |
           |   layer 1: block 0 .. n-1                    |
           |   ...                                        |
           |   zero padding to 4 KiB                      |
           +---------------------------------------------+  4 KiB aligned
           | segment 1 (turn 1)                           |
           +---------------------------------------------+
           end of file = end of the last segment (nothing is preallocated)

Layers of different sizes (version 2): the fixed ``block bytes`` field is 0 and each
header lists every layer's block bytes. Version 1 files (layers alike, no list) read
as they are: a version 2 header of a model whose layers are alike is the same bytes
but for the version. Sliding-window layers (version 3, written only when a layer has
a window): each header also lists every layer's window in blocks (0: all blocks),
and a segment's windowed layer holds only its last ``min(num_blocks, window)`` blocks
(``layout.SegmentLayout``); a model without windows writes version 2 file headers.
All integers are little-endian. Each header crc32 covers the whole header with its own
crc field zeroed; ``layer_crc[l]`` covers layer ``l``'s data bytes (no padding). A
segment is valid only if its header crc, its size (fits in the file) and every layer crc
check out.

Block crcs (version 4, what the writer writes): the windows are always listed (all 0
when no layer has one), then per layer one crc32 per block it holds (its *rows*, the
window's last blocks for a windowed layer): ``block_crc[l][k]`` is the running crc32 of
layer ``l``'s rows ``0..k`` (the last equals ``layer_crc[l]``), so a restore that wants
only some of a segment's blocks reads just those and checks them (``crc.range_crc``).
Segments of versions 1 to 3 have no table: a restore reads their layers whole.

Hit ends (version 6, written only when a segment keeps rows besides its end): the
runs ``(lo, hi)`` of blocks where a hit may end as well (``layout.SegmentLayout``'s
``ends``); a windowed layer holds the window before each, in block order. Version 5
(read only) recorded one ``mark``: the run ``(mark, num_blocks)``.

The file's size is its clean end (writers never preallocate). Anything else where a
segment should start is damage: a zeroed or corrupt header, a torn or corrupt segment,
zeros to the end of the file (a write interrupted by a crash, or lost data). The scan
(``cio.filescan``) then looks on, 4 KiB page by page, for later segments (valid header
crc, this file's id, a larger seq) to *count* them as lost with it. They are not
served: the file is cut at the damage (a later segment's blocks hang off the damaged
turn's prefix), but no intact turn disappears without being reported.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from flatcake.cio.crc import BlockCrcs, SegmentCrcs, crc32
from flatcake.control.sessions import MAX_SESSION_ID_BYTES
from flatcake.layout import (
    ALIGN,
    KEY_BYTES,
    SEGMENT_FIXED_HEADER_BYTES,
    SegmentLayout,
    check_ends,
)

FORMAT_VERSION = 2
"""The file header's version when no layer has a window."""
WINDOW_VERSION = 3
"""The version of a file header, or a segment without block crcs, when some layer has a
sliding window (its windows listed)."""
BLOCK_CRC_VERSION = 4
"""The version of every segment written: windows listed (0s when none) and a crc32 per
block each layer holds."""
MARK_VERSION = 5
"""A segment that recorded where its prompt branched off (read only): a version 4
segment with its mark after the fixed fields."""
ENDS_VERSION = 6
"""The version of a segment that keeps rows besides its end (``ends``): a version 4
segment with the number of runs after the fixed fields and the runs after its crcs."""
READ_VERSIONS = (1, 2, 3, 4, 5, 6)
"""Versions read; 2 added layers of different sizes, 3 sliding-window layers, 4 block
crcs, 5 the branch mark, 6 hit-end runs."""
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
# version 5: mark, version 6: number of hit-end runs, right after the fixed fields
# (inside SEGMENT_FIXED_HEADER_BYTES)
_SEG_MARK = struct.Struct("<I")


class FormatError(ValueError):
    """Bytes that are not a valid FlatCake header (wrong magic, version, crc or field)."""


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
        layer_block_bytes: bytes of one block of each layer (geometry check on open).
        layer_window_blocks: each layer's window in blocks (empty: none has one).
    """

    session_id: str
    file_id: int
    node_id: int
    virtual_base: int
    span_bytes: int
    layer_block_bytes: tuple[int, ...]
    layer_window_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        raw = self.session_id.encode("utf-8")
        if not raw or len(raw) > MAX_SESSION_ID_BYTES:
            raise ValueError(
                f"FileHeader.session_id must be 1..{MAX_SESSION_ID_BYTES} utf-8 bytes, got "
                f"{len(raw)} bytes"
            )
        for name in ("file_id", "virtual_base", "span_bytes"):
            value = getattr(self, name)
            if not 0 <= value < (1 << 64):
                raise ValueError(f"FileHeader.{name} must be an unsigned 64-bit int, got {value}")
        if not 0 <= self.node_id < (1 << 32):
            raise ValueError(f"FileHeader.node_id out of range, got {self.node_id}")
        _check_sizes("FileHeader", self.layer_block_bytes)
        _check_windows("FileHeader", self.layer_window_blocks, self.num_layers)
        room = _FILE_CRC_OFFSET - _FILE_FIXED.size - len(raw)
        lists = (len(set(self.layer_block_bytes)) > 1) + bool(self.layer_window_blocks)
        if 4 * self.num_layers * lists > room:
            raise ValueError(f"FileHeader: {self.num_layers} layer sizes and a session id "
                             f"of {len(raw)} bytes do not fit in {FILE_HEADER_BYTES} bytes")

    @property
    def num_layers(self) -> int:
        return len(self.layer_block_bytes)


def _check_sizes(what: str, sizes: tuple[int, ...]) -> None:
    if not isinstance(sizes, tuple) or not sizes or \
            not all(0 < size < (1 << 32) for size in sizes):
        raise ValueError(f"{what}.layer_block_bytes must be a non-empty tuple of sizes in "
                         f"(0, 2**32), got {sizes!r}")


def _check_windows(what: str, windows: tuple[int, ...], num_layers: int) -> None:
    if windows and (not isinstance(windows, tuple) or len(windows) != num_layers or
                    not all(0 <= w < (1 << 32) for w in windows) or not any(windows)):
        raise ValueError(f"{what}.layer_window_blocks must be empty or one window in "
                         f"[0, 2**32) per layer, some > 0, got {windows!r}")


def _version(windows: tuple[int, ...]) -> int:
    return WINDOW_VERSION if windows else FORMAT_VERSION


def _windows(buf: bytearray, pos: int, num_layers: int, version: int) -> tuple[int, ...]:
    """The windows listed at ``pos`` (version 3), else none."""
    if version < WINDOW_VERSION:
        return ()
    return tuple(struct.unpack_from(f"<{num_layers}I", buf, pos))


def _uniform_size(sizes: tuple[int, ...]) -> int:
    """The fixed header field: the block bytes of every layer, or 0 when they differ."""
    return sizes[0] if len(set(sizes)) == 1 else 0


def _sizes(buf: bytearray, pos: int, num_layers: int, fixed: int) -> tuple[int, ...]:
    if fixed:
        return (fixed,) * num_layers
    return tuple(struct.unpack_from(f"<{num_layers}I", buf, pos))


def encode_file_header(header: FileHeader) -> bytes:
    sid = header.session_id.encode("utf-8")
    buf = bytearray(FILE_HEADER_BYTES)
    _FILE_FIXED.pack_into(
        buf, 0, FILE_MAGIC, _version(header.layer_window_blocks), FILE_HEADER_BYTES,
        header.file_id, header.node_id,
        header.virtual_base, header.span_bytes, header.num_layers,
        _uniform_size(header.layer_block_bytes), len(sid),
    )
    buf[_FILE_FIXED.size:_FILE_FIXED.size + len(sid)] = sid
    pos = _FILE_FIXED.size + len(sid)
    if not _uniform_size(header.layer_block_bytes):
        struct.pack_into(f"<{header.num_layers}I", buf, pos, *header.layer_block_bytes)
        pos += 4 * header.num_layers
    if header.layer_window_blocks:
        struct.pack_into(f"<{header.num_layers}I", buf, pos, *header.layer_window_blocks)
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
    if version not in READ_VERSIONS:
        raise FormatError(f"file format version {version} is not supported")
    (stored,) = struct.unpack_from("<I", buf, _FILE_CRC_OFFSET)
    struct.pack_into("<I", buf, _FILE_CRC_OFFSET, 0)
    if crc32(buf) != stored:
        raise FormatError("file header crc32 mismatch")
    if header_bytes != FILE_HEADER_BYTES or sid_len > MAX_SESSION_ID_BYTES or \
            not 0 < num_layers < FILE_HEADER_BYTES // 4:
        raise FormatError(f"file header fields out of range (header_bytes={header_bytes}, "
                          f"num_layers={num_layers})")
    sid = bytes(buf[_FILE_FIXED.size:_FILE_FIXED.size + sid_len]).decode("utf-8")
    try:
        pos = _FILE_FIXED.size + sid_len
        sizes = _sizes(buf, pos, num_layers, bbpl)
        windows = _windows(buf, pos + (0 if bbpl else 4 * num_layers), num_layers, version)
        return FileHeader(sid, file_id, node_id, base, span, sizes, windows)
    except struct.error as exc:
        raise FormatError(f"file header layer sizes do not fit: {exc}") from None
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
        num_blocks, layer_block_bytes: the segment's geometry.
        keys: one 32-byte key per block, in block order.
        layer_crcs: crc32 of each layer's data bytes.
        layer_window_blocks: each layer's window in blocks (empty: none has one); a
            windowed layer holds the segment's last blocks only.
        block_crcs: per layer, the running crc32 of its rows ``0..k`` for each ``k``
            (``crc.BlockCrcs``); None for a segment of version 1 to 3.
        ends: runs ``(lo, hi)`` of blocks besides its end where a hit may end
            (version 6; ``layout.SegmentLayout``).
        ends_listed: the header lists ``ends`` (False: a version 5 segment's mark).
    """

    file_id: int
    seq: int
    turn_index: int
    first_block: int
    num_blocks: int
    layer_block_bytes: tuple[int, ...]
    keys: tuple[bytes, ...]
    layer_crcs: tuple[int, ...]
    layer_window_blocks: tuple[int, ...] = ()
    block_crcs: tuple[tuple[int, ...], ...] | None = None
    ends: tuple[tuple[int, int], ...] = ()
    ends_listed: bool = True

    def __post_init__(self) -> None:
        _check_sizes("SegmentHeader", self.layer_block_bytes)
        if self.ends:
            if not self.layer_window_blocks or self.block_crcs is None:
                raise ValueError(f"SegmentHeader.ends {self.ends} need windows and block "
                                 f"crcs")
            check_ends(self.ends, self.num_blocks)
        _check_windows("SegmentHeader", self.layer_window_blocks, self.num_layers)
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
        if self.block_crcs is not None:
            lay = self.layout
            if len(self.block_crcs) != self.num_layers or any(
                    len(t) != lay.layer_rows(i) or t[-1] != crc
                    for i, (t, crc) in enumerate(zip(self.block_crcs, self.layer_crcs,
                                                     strict=True))):
                raise ValueError("SegmentHeader.block_crcs must hold one running crc per "
                                 "row of each layer, each ending with its layer crc")

    @property
    def num_layers(self) -> int:
        return len(self.layer_block_bytes)

    @property
    def layout(self) -> SegmentLayout:
        return SegmentLayout.for_ssd(self.num_blocks, self.layer_block_bytes,
                                     self.layer_window_blocks, self.block_crcs is not None,
                                     self.ends, self.ends_listed)

    @property
    def crcs(self) -> SegmentCrcs:
        """What checks the segment's bytes when they are read."""
        return SegmentCrcs(self.layer_crcs, self.block_crcs)


def encode_segment_header(header: SegmentHeader) -> bytes:
    layout = header.layout
    buf = bytearray(layout.header_bytes)
    _SEG_FIXED.pack_into(
        buf, 0, SEGMENT_MAGIC,
        (ENDS_VERSION if header.ends_listed else MARK_VERSION) if header.ends
        else BLOCK_CRC_VERSION
        if header.block_crcs is not None
        else _version(header.layer_window_blocks), layout.header_bytes,
        header.file_id,
        header.seq, header.turn_index, header.first_block, header.num_blocks,
        header.num_layers,
        _uniform_size(header.layer_block_bytes), layout.data_bytes, 0,
    )
    if header.ends:
        _SEG_MARK.pack_into(buf, _SEG_FIXED.size, len(header.ends) if header.ends_listed
                            else header.ends[0][0])
    pos = SEGMENT_FIXED_HEADER_BYTES
    for key in header.keys:
        buf[pos:pos + KEY_BYTES] = key
        pos += KEY_BYTES
    struct.pack_into(f"<{header.num_layers}I", buf, pos, *header.layer_crcs)
    pos += 4 * header.num_layers
    if not _uniform_size(header.layer_block_bytes):
        struct.pack_into(f"<{header.num_layers}I", buf, pos, *header.layer_block_bytes)
        pos += 4 * header.num_layers
    if header.layer_window_blocks or header.block_crcs is not None:
        struct.pack_into(f"<{header.num_layers}I", buf, pos,
                         *(header.layer_window_blocks or (0,) * header.num_layers))
        pos += 4 * header.num_layers
    if header.ends and header.ends_listed:
        struct.pack_into(f"<{2 * len(header.ends)}I", buf, pos,
                         *(v for run in header.ends for v in run))
        pos += 8 * len(header.ends)
    if header.block_crcs is not None:
        flat = [c for table in header.block_crcs for c in table]
        struct.pack_into(f"<{len(flat)}I", buf, pos, *flat)
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
    if version not in READ_VERSIONS:
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
    (_magic, version, _hb, file_id, seq, turn_index, first_block, num_blocks, num_layers,
     bbpl, data_bytes, stored) = _SEG_FIXED.unpack_from(buf, 0)
    struct.pack_into("<I", buf, _SEG_CRC_OFFSET, 0)
    if crc32(buf) != stored:
        raise FormatError("segment header crc32 mismatch")
    pos = SEGMENT_FIXED_HEADER_BYTES + num_blocks * KEY_BYTES
    lists = (1 if bbpl else 2) + (version >= WINDOW_VERSION)
    if num_blocks <= 0 or num_layers <= 0 or pos + 4 * lists * num_layers > header_bytes:
        raise FormatError(f"segment geometry out of range: num_blocks={num_blocks} "
                          f"num_layers={num_layers}")
    sizes = _sizes(buf, pos + 4 * num_layers, num_layers, bbpl)
    if min(sizes) <= 0:
        raise FormatError(f"segment layer block bytes not positive: {sizes}")
    windows = _windows(buf, pos + 4 * num_layers * (lists - 1), num_layers, version)
    with_table = version >= BLOCK_CRC_VERSION
    if with_table and not any(windows):
        windows = ()
    elif version >= WINDOW_VERSION and not any(windows):
        raise FormatError("segment of version 3 lists no window")
    mark = _SEG_MARK.unpack_from(buf, _SEG_FIXED.size)[0] if version >= MARK_VERSION else 0
    if version == MARK_VERSION and not (windows and 0 < mark <= num_blocks):
        raise FormatError(f"segment of version {version} has mark {mark} out of range")
    if version >= ENDS_VERSION and not (windows and 0 < mark <= num_blocks):
        raise FormatError(f"segment of version {version} lists {mark} hit-end runs, "
                          f"expected 1..{num_blocks}")
    ends: tuple[tuple[int, int], ...] = ((mark, num_blocks),) if mark else ()
    listed = version != MARK_VERSION
    at = pos + 4 * num_layers * lists
    if version >= ENDS_VERSION:
        if at + 8 * mark > header_bytes:
            raise FormatError(f"segment lists {mark} hit-end runs past its header")
        flat_ends = struct.unpack_from(f"<{2 * mark}I", buf, at)
        ends = tuple(zip(flat_ends[::2], flat_ends[1::2], strict=True))
        at += 8 * mark
    try:
        layout = SegmentLayout.for_ssd(num_blocks, sizes, windows, with_table, ends, listed)
    except ValueError as exc:
        raise FormatError(f"segment header: {exc}") from None
    if layout.header_bytes != header_bytes:
        raise FormatError(f"segment header_bytes {header_bytes} does not match its geometry")
    if data_bytes != layout.data_bytes:
        raise FormatError(f"segment data_bytes {data_bytes} does not match its geometry")
    keys = tuple(bytes(buf[SEGMENT_FIXED_HEADER_BYTES + i * KEY_BYTES:
                           SEGMENT_FIXED_HEADER_BYTES + (i + 1) * KEY_BYTES])
                 for i in range(num_blocks))
    crcs = struct.unpack_from(f"<{num_layers}I", buf, pos)
    table = None
    if with_table:
        rows = [layout.layer_rows(i) for i in range(num_layers)]
        flat = struct.unpack_from(f"<{sum(rows)}I", buf, at)
        starts = [0, *itertools.accumulate(rows)]
        table = tuple(flat[a:b] for a, b in itertools.pairwise(starts))
    try:
        return SegmentHeader(file_id, seq, turn_index, first_block, num_blocks, sizes, keys,
                             tuple(crcs), windows, table, ends, listed)
    except ValueError as exc:
        raise FormatError(f"segment header: {exc}") from None


def compute_layer_crcs(segment_data: memoryview | bytes | bytearray,
                       layout: SegmentLayout) -> tuple[int, ...]:
    """crc32 of each layer of a segment's data region (``segment_data`` starts at the
    data offset, i.e. layer 0 block 0)."""
    mv = memoryview(segment_data).cast("B")
    base = layout.data_offset
    return tuple(
        crc32(mv[layout.layer_offset(layer) - base:
                 layout.layer_offset(layer) - base + layout.layer_bytes(layer)])
        for layer in range(layout.num_layers)
    )


def compute_block_crcs(segment_data: memoryview | bytes | bytearray,
                       layout: SegmentLayout) -> tuple[tuple[int, ...], ...]:
    """The running crc32 of each layer's blocks (``SegmentHeader.block_crcs``) of a
    segment's data region (``segment_data`` starts at layer 0 block 0)."""
    mv = memoryview(segment_data).cast("B")
    base = layout.data_offset
    out = []
    for layer in range(layout.num_layers):  # a windowed layer: the rows it holds
        running = BlockCrcs(layout.layer_block_bytes[layer])
        start = layout.layer_offset(layer) - base
        running.feed(mv[start:start + layout.layer_bytes(layer)])
        out.append(tuple(running.prefixes))
    return tuple(out)
