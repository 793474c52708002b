"""The store's spare memory and memory reclaim with real bytes: a memory copy of an
SSD turn serves restores byte-exact without touching the SSD (also when it spans
several arena extents), leaves the turn's home on disk, and a memory reclaim drops
memory-homed turns only: the session's SSD turns stay on disk and served."""

from __future__ import annotations

from pathlib import Path

import torch

from flatcake.clock import ManualClock
from flatcake.control.address import Medium
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    branch_keys,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

AGENT = TurnSignals(turn_index=2, context_tokens=10**6)  # a later turn homed on SSD


def same(dst: list, src: list, n: int, dst_slot0: int = 0, src_slot0: int = 0) -> bool:
    return all(block_bytes(dst, layer, dst_slot0 + i, "kv_blocks")
               == block_bytes(src, layer, src_slot0 + i, "kv_blocks")
               for layer in range(SMALL.num_layers) for i in range(n))


def test_copy_serves_restores_and_the_home_stays_on_disk(tmp_path: Path) -> None:
    src = random_kv(SMALL, 12)
    keys = session_keys(7, 10)
    cfg = small_config("placement.memory_copy_watermark=1.0")
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        res = store.store_turn("s", keys[:6], src, range(6), TO_SSD)
        assert res.medium == Medium.SSD and res.bytes_written > 0
        store.store_turn("s", keys, src, range(10), AGENT)
        hit = store.lookup(keys)
        assert (hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks) == (10, 10, 0)
        dst = empty_kv(SMALL, 12)
        out = store.load(keys, dst, range(2, 12))
        assert (out.num_blocks, out.num_memory_blocks, out.bytes_read) == (10, 10, 0)
        assert same(dst, src, 10, dst_slot0=2)
        assert store.control.stats().num_memory_copies == 2
        store.control.check_integrity()
    # A restart has no copies: the same bytes come from the segments' SSD home.
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        hit = store.lookup(keys)
        assert (hit.num_blocks, hit.num_ssd_blocks) == (10, 10)
        dst = empty_kv(SMALL, 12)
        out = store.load(keys, dst, range(10))
        assert out.num_ssd_blocks == 10 and out.bytes_read > 0
        assert same(dst, src, 10)


def test_memory_reclaim_keeps_the_ssd_turns_on_disk(tmp_path: Path) -> None:
    # Memory-homed segments of 2 blocks take one 4 KiB page; the arena has 3 pages.
    clock = ManualClock()
    cfg = small_config("store.memory_capacity_bytes=12288", "reclaim.memory_high=0.9",
                       "reclaim.memory_low=0.5")
    src = random_kv(SMALL, 8)
    a, b = session_keys(8, 6), session_keys(9, 8)
    branch = branch_keys(8, 2, 10, 5)  # a's first turn, then another conversation
    with FlatCakeStore.open(tmp_path, SMALL, cfg, clock=clock) as store:
        store.store_turn("a", a[:2], src, range(2), TO_SSD)
        assert store.store_turn("a", a[:4], src, range(4), TO_MEMORY).medium == Medium.MEMORY
        assert store.store_turn("a", branch, src, [0, 1, 5, 6, 7], AGENT).medium == Medium.SSD
        store.store_turn("a", a, src, range(6), AGENT)  # behind the memory turn
        assert store.lookup(a).num_blocks == 6
        clock.advance(10.0)
        store.store_turn("b", b[:2], src, range(2), TO_SSD)
        for n in (4, 6, 8):  # three memory turns: the third crosses the watermark
            store.store_turn("b", b[:n], src, range(n), TO_MEMORY)
        # a lost its memory turn only: the branch is served whole from the SSD, the
        # turn behind the memory turn stays indexed but cannot be reached.
        assert store.lookup(a).num_blocks == 2
        assert store.control.locate(a[2]) is None and store.control.locate(a[4]) is not None
        dst = empty_kv(SMALL, 8)
        out = store.load(branch, dst, range(5))
        assert (out.num_blocks, out.num_ssd_blocks) == (5, 5)
        assert same(dst, src, 2) and same(dst, src, 3, dst_slot0=2, src_slot0=5)
        assert store.lookup(b).num_blocks == 8
        store.control.check_integrity()
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        # Nothing was cut from the files: a restart finds every SSD turn.
        dst = empty_kv(SMALL, 8)
        assert store.load(branch, dst, range(5)).num_blocks == 5
        assert same(dst, src, 2) and same(dst, src, 3, dst_slot0=2, src_slot0=5)
        assert store.lookup(a).num_blocks == 2
        # The memory turn stored again: the SSD turn behind it is reached again.
        store.store_turn("a", a[:4], src, range(4), TO_MEMORY)
        dst = empty_kv(SMALL, 8)
        out = store.load(a, dst, range(6))
        assert (out.num_blocks, out.num_ssd_blocks) == (6, 4)
        assert same(dst, src, 6)
        store.control.check_integrity()


def test_a_restore_from_ssd_refills_memory_copies_byte_exact(tmp_path: Path) -> None:
    """copy_on_restore: the SSD segments a restore reads whole get memory copies written
    from the verified restored blocks; the next restore reads them, not the SSD, and
    gets the same bytes. With the option off the SSD is read every time."""
    src = random_kv(SMALL, 12)
    keys = session_keys(11, 10)
    for on in (True, False):
        root = tmp_path / str(on)
        cfg = small_config("placement.memory_copy_watermark=1.0",
                           f"placement.copy_on_restore={str(on).lower()}")
        with FlatCakeStore.open(root, SMALL, cfg) as store:
            store.store_turn("s", keys[:6], src, range(6), TO_SSD)
            store.store_turn("s", keys, src, range(10), AGENT)
        with FlatCakeStore.open(root, SMALL, cfg) as store:  # a restart: no copies
            first = store.load(keys, empty_kv(SMALL, 12), range(10))
            assert first.num_ssd_blocks == 10 and first.bytes_read > 0
            hit = store.lookup(keys)
            assert hit.num_memory_blocks == (10 if on else 0)
            dst = empty_kv(SMALL, 12)
            again = store.load(keys, dst, range(2, 12))
            assert (again.bytes_read == 0) is on
            assert same(dst, src, 10, dst_slot0=2)
            assert store.control.stats().num_memory_copies == (2 if on else 0)
            store.control.check_integrity()


def fragmented(store: FlatCakeStore, filler: list[torch.Tensor]) -> None:
    """An 8-page arena with one-page copies (2 blocks of 768 bytes) at pages 0..5 and
    holes at pages 1 and 3: 4 free pages, at most 2 of them in one extent."""
    for s in range(6):
        store.store_turn(f"f{s}", session_keys(20 + s, 2), filler, range(2), TO_SSD)
    store.drop_session("f1")
    store.drop_session("f3")
    assert store.control.arena.largest_free_bytes == 2 * 4096


def test_a_copy_over_several_arena_extents_restores_byte_exact(tmp_path: Path) -> None:
    """A 14-block turn (3 pages) in a fragmented arena: its memory copy is written in two
    pieces (10 blocks in pages 6..7, 4 in page 1) instead of dropping other copies to
    open one extent, and a restore reads every byte back from both pieces."""
    cfg = small_config("store.memory_capacity_bytes=32768",
                       "placement.memory_copy_watermark=1.0")
    filler, src = random_kv(SMALL, 4, seed=1), random_kv(SMALL, 16, seed=2)
    keys = session_keys(30, 14)
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        fragmented(store, filler)
        store.store_turn("g", keys, src, range(14), TO_SSD)
        home = store.control.locate(keys[0])
        assert home is not None and home.segment.medium == Medium.SSD
        copy = store.control.memory_copy(home.segment.segment_id)
        assert copy is not None
        assert [(p.offset // 4096, p.num_blocks) for p in copy.pieces] == [(6, 10), (1, 4)]
        st = store.control.stats()  # no copy made room: only f1's and f3's went
        assert (st.num_memory_copies, st.memory_copies_dropped) == (5, 2)
        dst = empty_kv(SMALL, 16)
        out = store.load(keys, dst, range(1, 15))
        assert (out.num_blocks, out.num_memory_blocks, out.bytes_read) == (14, 14, 0)
        assert same(dst, src, 14, dst_slot0=1)
        for s in (0, 2, 4, 5):  # the other copies still serve, their bytes untouched
            other = empty_kv(SMALL, 4)
            got = store.load(session_keys(20 + s, 2), other, range(2))
            assert got.bytes_read == 0 and same(other, filler, 2)
        store.control.check_integrity()


def test_a_refill_over_several_arena_extents_restores_byte_exact(tmp_path: Path) -> None:
    """copy_on_restore into a fragmented arena: the restore of a 14-block SSD turn fills
    a copy in two pieces, layer by layer; the next restore reads both from memory."""
    cfg = small_config("store.memory_capacity_bytes=32768",
                       "placement.memory_copy_watermark=1.0", "placement.copy_on_restore=true")
    filler, src = random_kv(SMALL, 4, seed=1), random_kv(SMALL, 16, seed=3)
    keys = session_keys(31, 14)
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        store.store_turn("g", keys, src, range(14), TO_SSD)
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:  # a restart: no copies
        fragmented(store, filler)
        first = store.load(keys, empty_kv(SMALL, 16), range(14))
        assert first.num_ssd_blocks == 14 and first.bytes_read > 0
        home = store.control.locate(keys[0])
        assert home is not None
        copy = store.control.memory_copy(home.segment.segment_id)
        assert copy is not None and len(copy.pieces) == 2
        dst = empty_kv(SMALL, 16)
        again = store.load(keys, dst, range(2, 16))
        assert (again.num_memory_blocks, again.bytes_read) == (14, 0)
        assert same(dst, src, 14, dst_slot0=2)
        store.control.check_integrity()
