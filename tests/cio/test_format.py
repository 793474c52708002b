"""Session file format: header round trips, damage detection, and the file scan."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.cio import format as fmt
from flatcake.cio.crc import crc32_combine, crc32_shift_operator
from flatcake.cio.direct import open_file, resolve_io_mode
from flatcake.cio.filescan import scan_session_file
from flatcake.cio.format import (
    FILE_HEADER_BYTES,
    FileHeader,
    FormatError,
    SegmentHeader,
    compute_block_crcs,
    compute_layer_crcs,
    decode_file_header,
    decode_segment_header,
    encode_file_header,
    encode_segment_header,
    parse_session_file_name,
    session_file_name,
)
from flatcake.cio.paged import PagedKV
from flatcake.cio.writer import SegmentWriter, write_file_header
from flatcake.layout import SEGMENT_FIXED_HEADER_BYTES, SegmentLayout, merge_ends


def _file_header(session_id: str = "chat/42", file_id: int = 7) -> FileHeader:
    return FileHeader(session_id=session_id, file_id=file_id, node_id=3,
                      virtual_base=5 << 30, span_bytes=1 << 20,
                      layer_block_bytes=(100,) * 3)


def _segment(seq: int, first_block: int, num_blocks: int, rng: random.Random,
             file_id: int = 7, num_layers: int = 3, bbpl: int = 100
             ) -> tuple[SegmentHeader, bytes]:
    layout = SegmentLayout.for_ssd(num_blocks, (bbpl,) * num_layers)
    data = rng.randbytes(layout.data_bytes)
    keys = tuple(rng.randbytes(32) for _ in range(num_blocks))
    header = SegmentHeader(file_id, seq, seq + 10, first_block, num_blocks,
                           (bbpl,) * num_layers, keys, compute_layer_crcs(data, layout),
                           block_crcs=compute_block_crcs(data, layout))
    raw = encode_segment_header(header) + data
    return header, raw + bytes(layout.total_bytes - len(raw))


def _write_file(path: Path, segments: list[bytes], tail_zero_bytes: int = 0) -> list[int]:
    offsets = []
    with open(path, "wb") as fh:
        fh.write(encode_file_header(_file_header()))
        for raw in segments:
            offsets.append(fh.tell())
            fh.write(raw)
        fh.write(bytes(tail_zero_bytes))  # an interrupted write's zeros
    return offsets


def test_fixed_segment_fields_fit_the_layout_constant() -> None:
    assert fmt._SEG_FIXED.size <= SEGMENT_FIXED_HEADER_BYTES


@given(sid=st.text(min_size=1, max_size=200), file_id=st.integers(0, 2**64 - 1))
def test_file_header_round_trip(sid: str, file_id: int) -> None:
    header = _file_header(sid, file_id)
    raw = encode_file_header(header)
    assert len(raw) == FILE_HEADER_BYTES
    assert decode_file_header(raw) == header


@settings(max_examples=50)
@given(num_blocks=st.integers(1, 200), num_layers=st.integers(1, 130),
       bbpl=st.integers(1, 1 << 20), seed=st.integers(0, 2**32), mixed=st.booleans())
def test_segment_header_round_trip(num_blocks: int, num_layers: int, bbpl: int,
                                   seed: int, mixed: bool) -> None:
    rng = random.Random(seed)
    sizes = tuple(rng.choice((bbpl, bbpl + 1, 3 * bbpl)) if mixed else bbpl
                  for _ in range(num_layers))
    header = SegmentHeader(9, 4, 3, 100, num_blocks, sizes,
                           tuple(rng.randbytes(32) for _ in range(num_blocks)),
                           tuple(rng.getrandbits(32) for _ in range(num_layers)))
    raw = encode_segment_header(header)
    assert len(raw) == header.layout.header_bytes
    assert decode_segment_header(raw) == header


@settings(max_examples=50)
@given(num_blocks=st.integers(1, 60), windows=st.lists(st.integers(0, 9), min_size=1,
                                                       max_size=40), mixed=st.booleans())
def test_headers_with_windows_round_trip_as_version_3(num_blocks: int, windows: list[int],
                                                      mixed: bool) -> None:
    if not any(windows):
        windows[0] = 1
    n = len(windows)
    sizes = tuple(584 + (i % 2 if mixed else 0) for i in range(n))
    header = SegmentHeader(9, 4, 3, 100, num_blocks, sizes,
                           tuple(bytes([i % 256]) * 32 for i in range(num_blocks)),
                           tuple(range(n)), tuple(windows))
    raw = encode_segment_header(header)
    assert int.from_bytes(raw[8:12], "little") == fmt.WINDOW_VERSION
    got = decode_segment_header(raw)
    assert got == header
    rows = [min(num_blocks, w) if w else num_blocks for w in windows]
    assert got.layout.data_bytes == sum(r * b for r, b in zip(rows, sizes, strict=True))
    file = FileHeader("s", 3, 0, 0, 1 << 20, sizes, tuple(windows))
    raw = encode_file_header(file)
    assert int.from_bytes(raw[8:12], "little") == fmt.WINDOW_VERSION
    assert decode_file_header(raw) == file
    # Without windows the headers stay version 2.
    plain = FileHeader("s", 3, 0, 0, 1 << 20, sizes)
    assert int.from_bytes(encode_file_header(plain)[8:12], "little") == fmt.FORMAT_VERSION


@settings(max_examples=50)
@given(num_blocks=st.integers(1, 40), window=st.integers(1, 9), data=st.data())
def test_hit_ends_round_trip_as_version_6(num_blocks: int, window: int,
                                          data: st.DataObject) -> None:
    picked = sorted(data.draw(st.sets(st.integers(1, num_blocks), max_size=6)))
    ends = merge_ends(*(((e, e),) for e in picked))
    sizes, windows = (512, 584), (0, window)
    # The rows by hand: each end's window, and the segment end's, counted once.
    held = {b for e in (*picked, num_blocks) for b in range(max(0, e - window), e)}
    header = SegmentHeader(9, 4, 3, 100, num_blocks, sizes,
                           tuple(bytes([i % 256]) * 32 for i in range(num_blocks)),
                           (1, 2), windows, ((1,) * num_blocks, (2,) * len(held)), ends)
    raw = encode_segment_header(header)
    assert int.from_bytes(raw[8:12], "little") == (fmt.ENDS_VERSION if ends
                                                  else fmt.BLOCK_CRC_VERSION)
    got = decode_segment_header(raw)
    assert got == header
    lay = got.layout
    assert lay.layer_rows(1) == len(held)
    assert [lay.row_index(1, b) for b in sorted(held)] == list(range(len(held)))
    for b in set(range(num_blocks)) - held:
        with pytest.raises(ValueError, match="not held"):
            lay.block_offset(1, b)
    # Ends the segment cannot hold are refused by name.
    with pytest.raises(ValueError, match="ends"):
        SegmentHeader(9, 4, 3, 100, num_blocks, sizes, header.keys, (1, 2), windows,
                      header.block_crcs, ((num_blocks + 1, num_blocks + 1),))


@settings(max_examples=30)
@given(num_blocks=st.integers(1, 40), window=st.integers(1, 9), data=st.data())
def test_a_version_5_branch_mark_still_reads(num_blocks: int, window: int,
                                            data: st.DataObject) -> None:
    """A version 5 segment recorded one mark: its rows from ``mark - window`` on."""
    mark = data.draw(st.integers(1, num_blocks))
    sizes, windows = (512, 584), (0, window)
    rows = num_blocks - max(0, min(num_blocks - min(num_blocks, window), mark - window))
    header = SegmentHeader(9, 4, 3, 100, num_blocks, sizes,
                           tuple(bytes([i % 256]) * 32 for i in range(num_blocks)),
                           (1, 2), windows, ((1,) * num_blocks, (2,) * rows),
                           ((mark, num_blocks),), ends_listed=False)
    raw = encode_segment_header(header)
    assert int.from_bytes(raw[8:12], "little") == fmt.MARK_VERSION
    got = decode_segment_header(raw)
    assert got == header
    assert got.layout.layer_rows(1) == rows
    assert got.layout.row_first(1) == num_blocks - rows


def test_header_byte_flips_are_detected() -> None:
    rng = random.Random(1)
    fh = bytearray(encode_file_header(_file_header()))
    sh, raw = _segment(0, 0, 5, rng)
    seg = bytearray(raw[:sh.layout.header_bytes])
    for pos in (0, 20, 60, FILE_HEADER_BYTES - 1):
        bad = bytearray(fh)
        bad[pos] ^= 0x01
        with pytest.raises(FormatError):
            decode_file_header(bad)
    for pos in (0, 40, SEGMENT_FIXED_HEADER_BYTES + 3, len(seg) - 1):
        bad = bytearray(seg)
        bad[pos] ^= 0x80
        with pytest.raises(FormatError):
            decode_segment_header(bad)


def test_file_names_are_hex_of_file_id_only() -> None:
    assert session_file_name(255) == "00000000000000ff.fcs"
    assert parse_session_file_name("00000000000000ff.fcs") == 255
    for name in ("../etc/passwd", "ff.fcs", "00000000000000ff.tmp", "zz00000000000000.fcs"):
        assert parse_session_file_name(name) is None
    with pytest.raises(ValueError, match="file_id"):
        session_file_name(-1)


def test_bad_header_fields_name_the_field() -> None:
    with pytest.raises(ValueError, match="session_id"):
        _file_header("")
    with pytest.raises(ValueError, match="keys"):
        SegmentHeader(1, 0, 0, 0, 2, (10,), (bytes(32),), (0,))
    with pytest.raises(ValueError, match=r"keys\[0\]"):
        SegmentHeader(1, 0, 0, 0, 1, (10,), (b"short",), (0,))
    with pytest.raises(ValueError, match="layer_crcs"):
        SegmentHeader(1, 0, 0, 0, 1, (10, 10), (bytes(32),), (0,))


def test_scan_returns_segments_in_order_and_stops_at_zeros(tmp_path: Path) -> None:
    rng = random.Random(2)
    segs = [_segment(0, 0, 4, rng), _segment(1, 4, 2, rng), _segment(2, 6, 7, rng)]
    path = tmp_path / session_file_name(7)
    offsets = _write_file(path, [raw for _, raw in segs])
    header, ok, damaged = scan_session_file(path)
    assert header == _file_header()
    assert [s.header for s in ok] == [h for h, _ in segs]
    assert [s.file_offset for s in ok] == offsets
    assert damaged == []


@pytest.mark.parametrize("where", ["data", "header", "truncate", "zeroed_data"])
def test_scan_stops_at_first_damaged_segment(tmp_path: Path, where: str) -> None:
    rng = random.Random(3)
    segs = [_segment(i, 4 * i, 4, rng) for i in range(3)]
    path = tmp_path / session_file_name(7)
    offsets = _write_file(path, [raw for _, raw in segs])
    layout = segs[1][0].layout
    with open(path, "r+b") as fh:
        if where == "data":
            fh.seek(offsets[1] + layout.data_offset + layout.data_bytes - 1)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        elif where == "header":
            fh.seek(offsets[1] + 70)
            fh.write(b"\x13")
        elif where == "zeroed_data":  # the header landed, the data did not
            fh.seek(offsets[1] + layout.data_offset)
            fh.write(bytes(layout.data_bytes))
    if where == "truncate":
        os.truncate(path, offsets[1] + layout.total_bytes - 4096)
    _, ok, damaged = scan_session_file(path)
    assert [s.header.seq for s in ok] == [0]  # later segments are not trusted either
    assert len(damaged) == 1 and damaged[0].file_offset == offsets[1]
    # Header-only scans (fast restart) still catch header damage and truncation.
    _, ok_fast, damaged_fast = scan_session_file(path, verify_data=False)
    if where in ("header", "truncate"):
        assert [s.header.seq for s in ok_fast] == [0] and len(damaged_fast) == 1
    else:
        assert len(ok_fast) == 3 and damaged_fast == []


def test_zeros_to_the_end_of_the_file_are_damage_not_the_end(tmp_path: Path) -> None:
    rng = random.Random(4)
    segs = [_segment(i, 4 * i, 4, rng) for i in range(2)]
    path = tmp_path / session_file_name(7)
    offsets = _write_file(path, [raw for _, raw in segs], tail_zero_bytes=8192)
    _, ok, damaged = scan_session_file(path)
    assert len(ok) == 2 and len(damaged) == 1
    assert damaged[0].file_offset == offsets[1] + segs[1][0].layout.total_bytes
    assert "zeros to the end" in damaged[0].reason and damaged[0].lost_segments == 0


def test_scan_rejects_damaged_file_header(tmp_path: Path) -> None:
    path = tmp_path / session_file_name(7)
    _write_file(path, [])
    with open(path, "r+b") as fh:
        fh.seek(30)
        fh.write(b"\xff")
    with pytest.raises(FormatError, match="crc"):
        scan_session_file(path)


def test_scan_rejects_out_of_order_segments(tmp_path: Path) -> None:
    rng = random.Random(4)
    path = tmp_path / session_file_name(7)
    _write_file(path, [_segment(1, 0, 2, rng)[1], _segment(1, 2, 2, rng)[1]])
    _, ok, damaged = scan_session_file(path)
    assert len(ok) == 1 and "follow" in damaged[0].reason


@pytest.mark.parametrize("chunk_bytes", [4096, 8192, 1 << 20])
def test_writer_segments_scan_back_byte_exact(tmp_path: Path, chunk_bytes: int) -> None:
    # Small chunks force the streaming path: blocks split across aligned writes.
    num_layers, bbpl, num_slots = 3, 100, 16
    g = torch.Generator().manual_seed(5)
    kv = [torch.randint(0, 256, (num_slots, bbpl), dtype=torch.uint8, generator=g)
          .view(torch.float32) for _ in range(num_layers)]
    paged = PagedKV(kv, bbpl)
    path = tmp_path / session_file_name(7)
    mode = resolve_io_mode(tmp_path, "auto")
    fd = open_file(path, mode, create=True)
    writer = SegmentWriter(chunk_bytes=chunk_bytes)
    turns = [[3, 1, 4], [15, 9, 2, 6, 5, 8, 0, 7, 10, 11, 12, 13], [14]]
    try:
        write_file_header(fd, FileHeader("s", 7, 0, 0, 1 << 20, (bbpl,) * num_layers))
        offset, first = FILE_HEADER_BYTES, 0
        for seq, ids in enumerate(turns):
            keys = [bytes([seq, i]) * 16 for i in range(len(ids))]
            w = writer.write_ssd(fd, offset, paged, paged.block_table(ids, unique=False), keys,
                                 file_id=7, seq=seq, turn_index=seq, first_block=first)
            offset += w.total_bytes
            first += len(ids)
    finally:
        os.close(fd)
    _, ok, damaged = scan_session_file(path)
    assert damaged == [] and [s.header.num_blocks for s in ok] == [3, 12, 1]
    raw = path.read_bytes()
    for seg, ids in zip(ok, turns, strict=True):
        lay = seg.header.layout
        for layer in range(num_layers):
            for j, slot in enumerate(ids):
                at = seg.file_offset + lay.block_offset(layer, j)
                assert raw[at:at + bbpl] == kv[layer][slot].view(torch.uint8).numpy().tobytes()


@settings(max_examples=40)
@given(a=st.binary(max_size=3000), b=st.binary(max_size=3000))
def test_crc32_combine_matches_zlib(a: bytes, b: bytes) -> None:
    op = crc32_shift_operator(len(b))
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), op) == zlib.crc32(a + b)


def test_fast_crc32_equals_zlib_including_combine() -> None:
    import random
    import zlib

    from flatcake.cio.crc import crc32, crc32_combine, crc32_shift_operator

    rng = random.Random(5)
    for n in (0, 1, 4095, 4096, 1 << 20):
        a = rng.randbytes(n)
        b = rng.randbytes(rng.randrange(1, 70_000))
        assert crc32(a) == zlib.crc32(a)
        assert crc32(b, crc32(a)) == zlib.crc32(a + b)
        combined = crc32_combine(crc32(a), crc32(b), crc32_shift_operator(len(b)))
        assert combined == zlib.crc32(a + b)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_block_crcs_check_any_run_of_blocks_a_restore_reads(data: st.DataObject) -> None:
    # Format version 4: the header's running block crcs give the crc32 of any run of a
    # segment's blocks, each layer over the rows it holds (a window: its last blocks).
    from flatcake.cio.crc import SegmentCrcs
    from flatcake.plan.stream import StreamCheck

    rng = random.Random(data.draw(st.integers(0, 1 << 30)))
    n = data.draw(st.integers(1, 9))
    sizes = tuple(data.draw(st.sampled_from([100, 584, 4096])) for _ in range(3))
    windows = data.draw(st.sampled_from([(), (0, 2, 0), (3, 0, 1)]))
    layout = SegmentLayout.for_ssd(n, sizes, windows)
    payload = rng.randbytes(layout.data_bytes)
    header = SegmentHeader(7, 0, 0, 0, n, sizes, tuple(rng.randbytes(32) for _ in range(n)),
                           compute_layer_crcs(payload, layout), windows,
                           compute_block_crcs(payload, layout))
    raw = encode_segment_header(header)
    assert int.from_bytes(raw[8:12], "little") == fmt.BLOCK_CRC_VERSION
    back = decode_segment_header(raw)
    assert back == header and back.layout == layout
    lo = data.draw(st.integers(0, n - 1))
    hi = data.draw(st.integers(lo + 1, n))
    held = tuple(layout.layer_first(k) for k in range(3)) if layout.is_windowed else ()
    check = StreamCheck(0, hi - lo, (), 0, 0, lo, hi - lo == n, held)
    got = SegmentCrcs(back.layer_crcs, back.block_crcs).over(check, sizes)
    assert got is not None
    for layer in range(3):
        first = max(lo, layout.layer_first(layer))
        want = zlib.crc32(b"".join(
            payload[layout.block_offset(layer, b) - layout.data_offset:
                    layout.block_offset(layer, b) - layout.data_offset + sizes[layer]]
            for b in range(first, hi))) if first < hi else 0
        assert got[layer] == want, layer
    assert SegmentCrcs(back.layer_crcs).over(check, sizes) is None  # versions 1 to 3


def test_a_block_crc_table_that_does_not_end_with_its_layer_crc_is_refused() -> None:
    layout = SegmentLayout.for_ssd(2, (100,))
    payload = bytes(range(200))
    blocks = compute_block_crcs(payload, layout)
    with pytest.raises(ValueError, match="block_crcs"):
        SegmentHeader(7, 0, 0, 0, 2, (100,), (bytes(32), bytes(32)),
                      compute_layer_crcs(payload, layout), (), ((blocks[0][0], 5),))


def test_range_crcs_of_long_runs_match_the_bytes() -> None:
    # Past 256 KiB the prefix is shifted with cached power-of-two operators, not zeros.
    from flatcake.cio.crc import BlockCrcs, range_crc

    bb = 65536
    data = random.Random(3).randbytes(bb * 12)
    running = BlockCrcs(bb)
    running.feed(memoryview(data))
    table = tuple(running.prefixes)
    for first, count in ((0, 12), (1, 11), (2, 5), (7, 1), (3, 4)):
        assert range_crc(table, first, count, bb) == \
            zlib.crc32(data[first * bb:(first + count) * bb]), (first, count)
