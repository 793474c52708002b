"""Zero-copy restores: reads land straight in aligned paged KV slots (``cio.zerocopy``),
checked on the reader threads; anything unaligned takes the staging window."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

import flatcake.cio.zerocopy as zerocopy
from flatcake.cio.direct import aligned_buffer
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader
from flatcake.cio.restore import LayerReady, RestoreOutcome
from flatcake.cio.staging import MAX_LAYERS_AHEAD, StagingWindow
from flatcake.layout import ALIGN
from flatcake.readplan import Piece, ReadOp
from tests.cio.helpers import History, RecordingReader, flip_byte, restore_job, write_history

BBPL = 8192


@pytest.fixture
def aligned_history(tmp_path: Path):  # type: ignore[no-untyped-def]
    h = write_history(tmp_path, [5, 1, 9, 4], bbpl=BBPL)
    yield h
    os.close(h.fd)


def _dest(h: History, kv_blocks: bool, shift: int = 0) -> list[torch.Tensor]:
    slots = h.num_blocks + 3
    out = []
    for _ in h.src:
        flat = aligned_buffer(slots * BBPL + shift, pin=False)[shift:].zero_()
        out.append(flat.view(2, slots, BBPL // 2) if kv_blocks else flat.view(slots, BBPL))
    return out


def _restore(h: History, dst: list[torch.Tensor], slots: list[int]
             ) -> tuple[RestoreOutcome, int]:
    reader = DirectReader(3)
    window = StagingWindow(reader)
    try:
        outcome = window.run(restore_job(h, dst, slots=slots), LayerReady(len(dst)))
    finally:
        window.close()
        reader.close()
    return outcome, reader.stats().commands


def _block(t: torch.Tensor, slot: int, kv_blocks: bool) -> torch.Tensor:
    return torch.cat([t[0, slot], t[1, slot]]) if kv_blocks else t[slot]


@pytest.mark.parametrize("kv_blocks", [False, True])
@pytest.mark.parametrize("iov_max", [1024, 3])
def test_reads_land_in_the_slots(aligned_history: History, kv_blocks: bool, iov_max: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zerocopy, "IOV_MAX", iov_max)  # 3: ops split into many commands
    h = aligned_history
    dst = _dest(h, kv_blocks)
    slots = [(7 * i + 2) % (h.num_blocks + 3) for i in range(h.num_blocks)]
    assert len(set(slots)) == len(slots)
    outcome, commands = _restore(h, dst, slots)
    assert outcome.zero_copy and outcome.zero_copy_refusal == ""
    assert outcome.num_blocks_loaded == h.num_blocks and outcome.failed_tags == ()
    assert outcome.commands == commands
    ops = sum(len(lp.ssd_ops) for lp in restore_job(h, dst, slots=slots).plan.layers)
    parts = 2 if kv_blocks else 1
    if iov_max == 3:
        assert commands > ops
    else:
        assert commands == ops
    assert commands <= ops + h.num_blocks * parts * len(dst)
    for layer, t in enumerate(dst):
        for b, slot in enumerate(slots):
            assert torch.equal(_block(t, slot, kv_blocks), h.src[layer][b])
        unused = set(range(h.num_blocks + 3)) - set(slots)
        assert all(not _block(t, s, kv_blocks).any() for s in unused)


def test_damaged_segment_is_a_miss_from_there_on(aligned_history: History) -> None:
    h = aligned_history
    seg = h.segments[2]  # request blocks [6, 15)
    at = seg.file_offset + seg.layout.block_offset(1, 4)  # type: ignore[operator]
    flip_byte(h.path, at)
    dst = _dest(h, kv_blocks=False)
    outcome, _ = _restore(h, dst, list(range(h.num_blocks)))
    assert outcome.zero_copy
    assert outcome.num_blocks_loaded == 6 and outcome.failed_tags == (2,)
    for layer, t in enumerate(dst):
        assert torch.equal(t[:6], h.src[layer][:6])


def test_unaligned_destination_takes_the_staging_window(aligned_history: History) -> None:
    h = aligned_history
    dst = _dest(h, kv_blocks=False, shift=64)  # torch's allocator aligns to 64 bytes
    slots = list(range(h.num_blocks, 0, -1))
    outcome, _ = _restore(h, dst, slots)
    assert not outcome.zero_copy
    assert outcome.zero_copy_refusal == "paged KV layer 0 is not 4096-aligned"
    assert outcome.num_blocks_loaded == h.num_blocks
    for layer, t in enumerate(dst):
        assert torch.equal(t[slots], h.src[layer])


def test_small_blocks_take_the_staging_window(tmp_path: Path) -> None:
    h = write_history(tmp_path, [3, 2], bbpl=300)
    try:
        dst = [aligned_buffer(h.num_blocks * 300, pin=False).view(h.num_blocks, 300)
               for _ in h.src]
        outcome, _ = _restore(h, dst, list(range(h.num_blocks)))
    finally:
        os.close(h.fd)
    assert not outcome.zero_copy
    assert outcome.zero_copy_refusal == "a block part of 300 bytes is not a multiple of 4096"
    for layer, t in enumerate(dst):
        assert torch.equal(t, h.src[layer])


def test_the_store_reports_the_read_path(tmp_path: Path) -> None:
    from flatcake.geometry import KVGeometry
    from flatcake.store import FlatCakeStore, TurnSignals
    from tests.store.helpers import TO_MEMORY, TO_SSD, random_kv, session_keys, small_config

    g = KVGeometry(num_layers=2, tokens_per_block=16, num_kv_heads=1, head_dim=128,
                   dtype="float16", name="k4")  # K and V halves of 4 KiB per block
    src = random_kv(g, 6)
    keys = session_keys(1, 6)

    def dest(shift: int) -> list[torch.Tensor]:
        half = g.block_bytes_per_layer // 2
        return [aligned_buffer(6 * 2 * half + shift, pin=False)[shift:].zero_()
                .view(torch.float16).view(2, 6, 16, 1, 128) for _ in range(g.num_layers)]

    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        # Turn 0 (blocks 0-3) on SSD, turn 1 (blocks 4-5) in host memory: the SSD part
        # is read into the slots, the memory part copied into its slots.
        store.store_turn("s", keys[:4], src, range(4), TO_SSD)
        store.store_turn("s", keys, src, range(6),
                         TurnSignals(turn_index=1, context_tokens=64,
                                     prev_reply_tokens=TO_MEMORY.prev_reply_tokens))
        for shift, path, reason in ((0, "zero-copy", ""),
                                    (64, "staging", "paged KV layer 0 is not 4096-aligned")):
            dst = dest(shift)
            res = store.load(keys, dst, [5, 4, 3, 2, 1, 0])
            assert (res.num_blocks, res.read_path, res.staging_reason) == (6, path, reason)
            assert (res.num_ssd_blocks, res.num_memory_blocks) == (4, 2)
            for layer in range(g.num_layers):
                assert torch.equal(dst[layer].flip(1).contiguous().view(torch.uint8),
                                   src[layer].view(torch.uint8))  # bytes: NaN != NaN


def test_zero_copy_reads_further_ahead_than_two_layers(tmp_path: Path) -> None:
    """No copy out of the slots to wait for: a zero-copy restore submits more layers
    before the first is ready (small segment layers keep the disk's queue deep), each
    into its own staging slot, and still lands every byte where it belongs."""
    h = write_history(tmp_path, [5, 1, 9, 4], num_layers=8, bbpl=BBPL)
    try:
        dst = _dest(h, kv_blocks=True)
        slots = list(range(h.num_blocks))
        job = restore_job(h, dst, slots=slots)
        log: list[tuple[str, int]] = []

        class RecordingReady(LayerReady):
            def set(self, layer: int) -> None:
                log.append(("ready", layer))
                super().set(layer)

        reader = RecordingReader(job.plan, log)
        window = StagingWindow(reader)  # no bound: every submitted read reaches the log
        try:
            outcome = window.run(job, RecordingReady(len(dst)))
        finally:
            window.close()
            reader.close()
    finally:
        os.close(h.fd)
    assert outcome.zero_copy and outcome.num_blocks_loaded == h.num_blocks
    # A few commands a layer: layers 0 and 1 are all the two-slot window would have out;
    # the zero-copy window has layer 2's reads out before layer 0 is ready.
    assert log.index(("read", 2)) < log.index(("ready", 0))
    assert max(layer for kind, layer in log[:log.index(("ready", 0))] if kind == "read") \
        <= 1 + MAX_LAYERS_AHEAD
    for layer, t in enumerate(dst):
        for b, slot in enumerate(slots):
            assert torch.equal(_block(t, slot, True), h.src[layer][b])


@pytest.mark.parametrize("kv_blocks", [False, True])
def test_op_commands_cover_the_op_in_file_order(kv_blocks: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # One op: a gap, a piece of three blocks (the middle one read for its crc only),
    # a gap, a piece of two blocks, a tail; split into commands of at most 4 iovecs.
    monkeypatch.setattr(zerocopy, "IOV_MAX", 4)
    dst = [aligned_buffer(6 * BBPL, pin=False)]
    dst = [dst[0].view(2, 6, BBPL // 2) if kv_blocks else dst[0].view(6, BBPL)]
    paged = PagedKV(dst, BBPL)
    views = zerocopy.SlotViews(paged)
    staging = memoryview(bytearray(16 * BBPL))
    pieces = (Piece(0, ALIGN, 3 * BBPL), Piece(3 * BBPL, 4 * BBPL, 2 * BBPL))
    op = ReadOp(0, 0, 7 * BBPL, pieces)
    slots = [4, -1, 0, 5, 2]
    cmds = list(zerocopy.op_commands(op, 0, BBPL, slots, views, staging, BBPL, "f", 7))
    base = paged.layer_bytes()[0].data_ptr()
    half = BBPL // 2 if kv_blocks else BBPL

    def addr(v: memoryview) -> int:
        return torch.frombuffer(v, dtype=torch.uint8).data_ptr()

    def block(slot: int) -> list[tuple[int, int]]:
        if not kv_blocks:
            return [(base + slot * BBPL, BBPL)]
        return [(base + slot * half, half), (base + 6 * half + slot * half, half)]

    sbase = addr(staging)
    want_first = [(sbase + BBPL, ALIGN), *block(4), (sbase + BBPL + ALIGN + BBPL, BBPL),
                  *block(0)]
    want_second = [*block(5), *block(2)]
    gap = (sbase + BBPL + ALIGN + 3 * BBPL, BBPL - ALIGN)
    tail = (sbase + BBPL + 6 * BBPL, BBPL)
    want = [*want_first, gap, *want_second, tail]
    got = [(addr(v), len(v)) for _, iov, _ in cmds for v in iov.views]
    assert got == want
    assert all(len(iov.views) <= 4 for _, iov, _ in cmds)
    offsets = [(req.file_offset, req.length) for req, _, _ in cmds]
    assert offsets[0][0] == 0 and sum(n for _, n in offsets) == 7 * BBPL
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))
    # Each piece's iovecs, gathered from the commands' (piece, first, end) spans, are
    # exactly its bytes in order.
    per_piece: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for _, iov, spans in cmds:
        for k, lo, hi in spans:
            per_piece[k] += [(addr(v), len(v)) for v in iov.views[lo:hi]]
    n0 = len(want_first) - 1
    assert per_piece[0] == want[1:1 + n0]
    assert per_piece[1] == want_second
