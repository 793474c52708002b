"""Segment writes (``cio.writer``): zero-copy ``pwritev`` from aligned slots and the
gather ring for everything else give the same bytes on disk, scan back whole, and a
failed command fails the write only after every command in flight has finished."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
import torch

import flatcake.cio.writer as writer_mod
from flatcake.cio.direct import aligned_buffer, open_file, resolve_io_mode
from flatcake.cio.filescan import scan_session_file
from flatcake.cio.format import FILE_HEADER_BYTES, FileHeader, session_file_name
from flatcake.cio.paged import PagedKV
from flatcake.cio.writer import SegmentWriter, write_file_header, zero_copy_write_refusal
from flatcake.layout import SegmentLayout

NUM_LAYERS, SLOTS = 3, 24
TURNS = [[3, 4, 5, 9], [0, 1, 2, 17, 18, 19, 20, 6], [23]]


Sizes = int | tuple[int, ...]  # one block size for every layer, or one per layer


def _sizes(bbpl: Sizes) -> tuple[int, ...]:
    return bbpl if isinstance(bbpl, tuple) else (bbpl,) * NUM_LAYERS


def _kv(sizes: Sizes, kv_blocks: bool, aligned: bool, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for bbpl in _sizes(sizes):
        data = torch.randint(0, 256, (SLOTS * bbpl,), dtype=torch.uint8, generator=g)
        flat = aligned_buffer(SLOTS * bbpl, pin=False) if aligned else torch.empty_like(data)
        flat.copy_(data)
        out.append(flat.view(2, SLOTS, bbpl // 2) if kv_blocks else flat.view(SLOTS, bbpl))
    return out


def _block(t: torch.Tensor, slot: int, kv_blocks: bool) -> bytes:
    b = torch.cat([t[0, slot], t[1, slot]]) if kv_blocks else t[slot]
    return b.numpy().tobytes()


def _write(tmp_path: Path, kv: list[torch.Tensor], bbpl: Sizes, writer: SegmentWriter
           ) -> tuple[Path, list[str]]:
    paged = PagedKV(kv, _sizes(bbpl), "kv_blocks" if kv[0].dim() == 3 else "blocks")
    path = tmp_path / session_file_name(7)
    fd = open_file(path, resolve_io_mode(tmp_path, "auto"), create=True)
    paths = []
    try:
        write_file_header(fd, FileHeader("s", 7, 0, 0, 1 << 24, _sizes(bbpl)))
        offset, first = FILE_HEADER_BYTES, 0
        for seq, ids in enumerate(TURNS):
            keys = [bytes([seq, i]) * 16 for i in range(len(ids))]
            w = writer.write_ssd(fd, offset, paged, paged.block_table(ids, unique=False),
                                 keys, file_id=7, seq=seq, turn_index=seq, first_block=first)
            paths.append(w.write_path)
            offset += w.total_bytes
            first += len(ids)
    finally:
        os.close(fd)
        writer.close()
    return path, paths


def _assert_on_disk(path: Path, kv: list[torch.Tensor], sizes: Sizes, kv_blocks: bool
                    ) -> None:
    _, ok, damaged = scan_session_file(path)
    assert damaged == [] and [s.header.num_blocks for s in ok] == [len(t) for t in TURNS]
    raw = path.read_bytes()
    for seg, ids in zip(ok, TURNS, strict=True):
        lay = seg.header.layout
        for layer, bbpl in enumerate(_sizes(sizes)):
            for j, slot in enumerate(ids):
                at = seg.file_offset + lay.block_offset(layer, j)
                assert raw[at:at + bbpl] == _block(kv[layer], slot, kv_blocks)


@pytest.mark.parametrize("kv_blocks", [False, True])
@pytest.mark.parametrize("chunk_bytes", [8192, 16384, 1 << 20])
def test_zero_copy_writes_the_slots_byte_exact(tmp_path: Path, kv_blocks: bool,
                                               chunk_bytes: int) -> None:
    bbpl = 8192
    kv = _kv(bbpl, kv_blocks, aligned=True)
    path, paths = _write(tmp_path, kv, bbpl, SegmentWriter(chunk_bytes, in_flight=2))
    assert paths == ["zero-copy"] * len(TURNS)
    _assert_on_disk(path, kv, bbpl, kv_blocks)


def test_zero_copy_splits_commands_at_iov_max(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_mod, "IOV_MAX", 3)
    kv = _kv(8192, True, aligned=True)
    path, paths = _write(tmp_path, kv, 8192, SegmentWriter(1 << 20, in_flight=3))
    assert paths == ["zero-copy"] * len(TURNS)
    _assert_on_disk(path, kv, 8192, True)


@pytest.mark.parametrize(("bbpl", "aligned", "reason"), [
    (8192, False, "not 4096-aligned"),
    (300, True, "not a multiple of 4096"),
])
@pytest.mark.parametrize("chunk_bytes", [4096, 12288, 1 << 20])
def test_gather_ring_writes_the_same_bytes(tmp_path: Path, bbpl: int, aligned: bool,
                                           reason: str, chunk_bytes: int) -> None:
    kv = _kv(bbpl, False, aligned=aligned)
    if not aligned and all(t.data_ptr() % 4096 == 0 for t in kv):
        pytest.skip("the allocator happened to return page-aligned tensors")
    assert reason in zero_copy_write_refusal(PagedKV(kv, bbpl, "blocks"))
    path, paths = _write(tmp_path, kv, bbpl, SegmentWriter(chunk_bytes, in_flight=2))
    assert paths == ["gather"] * len(TURNS)
    _assert_on_disk(path, kv, bbpl, False)


@pytest.mark.parametrize("kv_blocks", [False, True])
@pytest.mark.parametrize("chunk_bytes", [4096, 40960, 1 << 20])
def test_host_blocks_are_gathered_by_memmove(tmp_path: Path, kv_blocks: bool,
                                             chunk_bytes: int) -> None:
    bbpl = 65536  # parts of 32 KiB or more: copied by memmove, not index_select
    kv = _kv(bbpl, kv_blocks, aligned=False)
    paged = PagedKV(kv, bbpl, "kv_blocks" if kv_blocks else "blocks")
    assert all(writer_mod._HostGather(paged, paged.block_table([5, 2], unique=False)).use)
    path, paths = _write(tmp_path, kv, bbpl, SegmentWriter(chunk_bytes, zero_copy=False))
    assert paths == ["gather"] * len(TURNS)
    _assert_on_disk(path, kv, bbpl, kv_blocks)
    dest = torch.zeros(NUM_LAYERS * 3 * bbpl, dtype=torch.uint8)
    SegmentWriter.write_memory(dest, paged, paged.block_table([7, 8, 1], unique=False))
    for layer in range(NUM_LAYERS):
        for j, slot in enumerate([7, 8, 1]):
            at = (layer * 3 + j) * bbpl
            assert dest[at:at + bbpl].numpy().tobytes() == _block(kv[layer], slot, kv_blocks)


def test_host_gather_refuses_block_ids_out_of_range() -> None:
    paged = PagedKV(_kv(65536, False, aligned=False), 65536, "blocks")
    with pytest.raises(ValueError, match="block ids"):
        writer_mod._HostGather(paged, torch.tensor([3, SLOTS]))


def test_zero_copy_off_takes_the_gather_ring(tmp_path: Path) -> None:
    kv = _kv(8192, False, aligned=True)
    path, paths = _write(tmp_path, kv, 8192, SegmentWriter(16384, zero_copy=False))
    assert paths == ["gather"] * len(TURNS)
    _assert_on_disk(path, kv, 8192, False)


@pytest.mark.parametrize("zero_copy", [False, True])
def test_a_failed_command_fails_the_write_after_the_others_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zero_copy: bool) -> None:
    kv = _kv(8192, False, aligned=True)
    paged = PagedKV(kv, 8192, "blocks")
    writer = SegmentWriter(8192, in_flight=3, zero_copy=zero_copy)
    running, finished = set(), []
    lock = threading.Lock()
    real, real_v = os.pwrite, os.pwritev

    def flaky(write):  # type: ignore[no-untyped-def]
        def call(fd: int, data: object, offset: int) -> int:
            with lock:
                running.add(offset)
            try:
                if offset == FILE_HEADER_BYTES + 4096 + 3 * 8192:  # the fourth command
                    raise OSError(errno.EIO, "injected")
                return int(write(fd, data, offset))
            finally:
                with lock:
                    running.discard(offset)
                    finished.append(offset)
        return call

    monkeypatch.setattr("flatcake.cio.direct.os.pwrite", flaky(real))
    monkeypatch.setattr("flatcake.cio.direct.os.pwritev", flaky(real_v))
    path = tmp_path / session_file_name(7)
    fd = open_file(path, resolve_io_mode(tmp_path, "auto"), create=True)
    try:
        with pytest.raises(OSError, match="injected"):
            writer.write_ssd(fd, FILE_HEADER_BYTES, paged, paged.block_table(
                list(range(8)), unique=False), [bytes(32)] * 8, file_id=7, seq=0,
                turn_index=0, first_block=0)
        assert not running  # nothing still writing once the call has raised
        assert FILE_HEADER_BYTES not in finished  # no header after a failed data write
    finally:
        os.close(fd)
        writer.close()


def test_bad_writer_settings_are_value_errors() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        SegmentWriter(1000)
    with pytest.raises(ValueError, match="in_flight"):
        SegmentWriter(4096, in_flight=0)


@pytest.mark.parametrize(("sizes", "path"), [
    ((8192, 4096, 12288), "zero-copy"),  # every block part 4 KiB aligned
    ((8192, 300, 4096), "gather"),
    ((65536, 300, 98304), "gather"),  # the large layers gathered by memmove
])
@pytest.mark.parametrize("chunk_bytes", [4096, 12288, 1 << 20])
def test_layers_of_different_sizes_are_written_layer_after_layer(
        tmp_path: Path, sizes: tuple[int, ...], path: str, chunk_bytes: int) -> None:
    kv = _kv(sizes, False, aligned=True)
    paged = PagedKV(kv, sizes, "blocks")
    use = writer_mod._HostGather(paged, paged.block_table(TURNS[1], unique=False)).use
    # memmove for the layers whose copies are large: 8 blocks in 3 runs of slots
    assert use == [8 * b >= 3 * writer_mod._HostGather.MIN_SPAN_BYTES for b in sizes]
    file, paths = _write(tmp_path, kv, sizes, SegmentWriter(chunk_bytes, in_flight=2))
    assert paths == [path] * len(TURNS)
    _assert_on_disk(file, kv, sizes, False)


@pytest.mark.parametrize(("windows", "ends"), [((), ()), ((0, 2, 3), ((3, 3),))])
@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_a_memory_segment_written_back_is_the_segment_the_paged_kv_gives(
        tmp_path: Path, windows: tuple[int, ...], ends: tuple[tuple[int, int], ...],
        chunk_bytes: int) -> None:
    """``write_ssd_from_memory`` (a not-yet home written back from the arena) writes the
    bytes, header and crcs ``write_ssd`` writes from the slots it was gathered from,
    windowed layers and their extra ends included, on either write path."""
    bbpl = 4096
    kv = _kv(bbpl, False, aligned=True)
    paged = PagedKV(kv, _sizes(bbpl), "blocks")
    ids = paged.block_table([3, 9, 4, 12, 5, 6], unique=False)
    keys = [bytes([i]) * 32 for i in range(6)]
    home = torch.zeros(NUM_LAYERS * 6 * bbpl, dtype=torch.uint8)
    SegmentWriter.write_memory(home, paged, ids, windows, ends)
    layout = SegmentLayout.for_memory(6, _sizes(bbpl), windows, ends)
    path = tmp_path / session_file_name(7)
    fd = open_file(path, resolve_io_mode(tmp_path, "auto"), create=True)
    writer = SegmentWriter(chunk_bytes)
    try:
        write_file_header(fd, FileHeader("s", 7, 0, 0, 1 << 24, _sizes(bbpl), windows))
        where = dict(file_id=7, seq=0, turn_index=0, first_block=0)
        a = writer.write_ssd(fd, FILE_HEADER_BYTES, paged, ids, keys,
                             layer_window_blocks=windows, ends=ends, **where)
        b = writer.write_ssd_from_memory(fd, FILE_HEADER_BYTES + a.total_bytes, home,
                                         layout, keys, **where)
    finally:
        os.close(fd)
        writer.close()
    assert b.header == a.header and b.total_bytes == a.total_bytes
    assert b.write_path == "gather"
    raw = path.read_bytes()
    first = raw[FILE_HEADER_BYTES:FILE_HEADER_BYTES + a.total_bytes]
    assert raw[FILE_HEADER_BYTES + a.total_bytes:FILE_HEADER_BYTES + 2 * a.total_bytes] \
        == first


def test_a_write_back_needs_a_memory_segment(tmp_path: Path) -> None:
    layout = SegmentLayout.for_ssd(2, (4096,) * NUM_LAYERS)
    with pytest.raises(ValueError, match="memory segment"):
        SegmentWriter().write_ssd_from_memory(0, 0, torch.zeros(2 * 3 * 4096,
                                                                dtype=torch.uint8),
                                              layout, [bytes(32)] * 2, file_id=0, seq=0,
                                              turn_index=0, first_block=0)
