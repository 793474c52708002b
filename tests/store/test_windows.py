"""Sliding-window layers: a segment keeps only the last blocks of a windowed layer, so
a session's SSD bytes grow by at most the window per turn in those layers; every
restore is byte for byte in its full-attention layers and in each window, through the
staging path, from SSD and host memory and after a restart; a hit whose window is not
held is cut back; a rotted byte in a window's rows cuts the restore at its turn; and a
prompt branching off a stored prefix keeps its window rows from the branch on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flatcake.cio.files import SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.cli import main
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.layout import align_up, segment_header_bytes
from flatcake.store import FlatCakeStore, TurnSignals
from flatcake.store.inspect import inspect_root
from tests.store.helpers import (
    TO_SSD,
    paged,
    rot_last_segment,
    session_keys,
    small_config,
    store_three_turns,
)

# Two full-attention layers (8 KiB a block) and two sliding-window layers of 48 tokens
# (3 blocks of 16 tokens, 584 B a block: not a multiple of 4 KiB).
WINDOWED = KVGeometry(
    num_layers=4, tokens_per_block=16, dtype="uint8", name="windowed",
    groups=(LayerGroup(2, 512, kind="full"),
            LayerGroup(2, 584, tokens_per_entry=16, window_tokens=48, kind="sliding")))
FULL, SLIDING, WINDOW = (0, 1), (2, 3), 3
# One full layer (8 KiB a block) and two sliding layers of 2 blocks (4 KiB a block).
WINDOWED_4K = KVGeometry(num_layers=3, tokens_per_block=16, dtype="uint8", name="windowed-4k",
                         groups=(LayerGroup(1, 512, kind="full"),
                                 LayerGroup(2, 256, window_tokens=32, kind="sliding")))


def assert_windowed(dst: list[torch.Tensor], src: list[torch.Tensor], slots: list[int],
                    num_blocks: int) -> None:
    """Full layers: every restored block; sliding layers: the last WINDOW blocks."""
    for layer in FULL:
        assert torch.equal(dst[layer][slots[:num_blocks]], src[layer][:num_blocks]), layer
    lo = max(0, num_blocks - WINDOW)
    for layer in SLIDING:
        assert torch.equal(dst[layer][slots[lo:num_blocks]], src[layer][lo:num_blocks]), \
            layer


def test_sliding_layers_grow_by_at_most_the_window_per_turn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = WINDOWED
    assert g.layer_window_blocks == (0, 0, 3, 3)
    turns, per_turn = 12, 5
    total = turns * per_turn
    src = paged(g, total, seed=7)
    keys = session_keys(7, total, g)
    cfg = small_config()
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        for t in range(turns):
            n = (t + 1) * per_turn
            res = store.store_turn("s", keys[:n], src, range(n), TurnSignals(
                turn_index=t, context_tokens=0))
            assert res.num_blocks == per_turn and res.medium is not None
            assert res.medium.name == "SSD"
        assert store.fsck().clean  # every window's crc32 checks out on disk
        (path,) = sorted((tmp_path / SESSIONS_DIR).iterdir())
        _, segs, _ = scan_session_file(path, verify_data=True)
        assert len(segs) == turns
        for seg in segs:  # the sliding layers hold 3 of the turn's 5 blocks
            lay = seg.header.layout
            assert [lay.layer_rows(layer) for layer in range(4)] == [5, 5, 3, 3]
        full_turn = align_up(segment_header_bytes(per_turn, g.layer_block_bytes, True)
                             + per_turn * 2 * 8192 + WINDOW * 2 * 584)
        assert path.stat().st_size == 4096 + turns * full_turn
        # Every turn keeps 2 x 2 x 584 B fewer than all of its blocks would.
        kept = sum(s.header.layout.data_bytes for s in segs)
        assert total * g.block_bytes - kept == turns * (per_turn - WINDOW) * 2 * 584
        dst = paged(g, total)
        slots = list(range(total - 1, -1, -1))
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.damaged_segments) == (total, 0)
        assert res.commands <= 2 * g.num_layers * turns  # (2 kinds x layers) x turns
        assert res.useful_bytes == total * 2 * 8192 + turns * WINDOW * 2 * 584
        assert_windowed(dst, src, slots, total)
        # No slot of a sliding layer gets a block it does not hold.
        for layer in SLIDING:
            held = {b for s in range(turns) for b in range(s * 5 + 2, s * 5 + 5)}
            for b in set(range(total)) - held:
                assert not dst[layer][slots[b]].any(), (layer, b)
    with FlatCakeStore.open(tmp_path, g, cfg) as store:  # the windows read back
        dst = paged(g, total)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.damaged_segments) == (total, 0)
        assert_windowed(dst, src, slots, total)
    # inspect counts what each kind holds and what the window saved.
    assert inspect_root(tmp_path)["layer_kinds"] == [
        {"kind": "full", "stored_bytes": total * 2 * 8192, "saved_bytes": 0,
         "released_bytes": 0},
        {"kind": "sliding", "stored_bytes": turns * WINDOW * 2 * 584,
         "saved_bytes": turns * (per_turn - WINDOW) * 2 * 584,
         "released_bytes": 0}]  # 3 x 2 x 584 B rows span no whole page: all kept
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "full layers on SSD: 960.00 KiB\n" in out
    assert "sliding layers on SSD: 41.06 KiB (27.38 KiB saved: only the window is stored)" \
        in out


def test_memory_and_ssd_turns_restore_the_window(tmp_path: Path) -> None:
    g = WINDOWED
    src = paged(g, 12, seed=8)
    keys = session_keys(8, 12, g)
    slots = [13, 2, 7, 0, 15, 4, 9, 1, 12, 3, 6, 10]
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store_three_turns(store, keys, src)  # 5 blocks SSD, 3 memory, 4 SSD
        for end in (5, 8, 12):  # each turn's end: its window is held
            dst = paged(g, 16)
            res = store.load(keys[:end], dst, slots)
            assert (res.num_blocks, res.damaged_segments) == (end, 0)
            assert_windowed(dst, src, slots, end)


def test_a_hit_whose_window_is_not_held_is_cut_back(tmp_path: Path) -> None:
    g = WINDOWED
    src = paged(g, 20, seed=9)
    keys = session_keys(9, 20, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store.store_turn("s", keys[:10], src, range(10), TO_SSD)
        store.store_turn("s", keys[:11], src, range(11), TurnSignals(1, 0))
        assert store.lookup(keys[:10]).num_blocks == 10
        assert store.lookup(keys[:11]).num_blocks == 11  # 1 new block + 2 of turn 0
        # Ending inside turn 0 (blocks 4-6 are not held by the sliding layers): no hit.
        assert store.lookup(keys[:7]).num_blocks == 0
        assert store.lookup(keys[:20]).num_blocks == 11


def test_a_rotted_byte_in_a_window_cuts_the_restore_at_its_turn(tmp_path: Path) -> None:
    g = WINDOWED
    src = paged(g, 12, seed=10)
    keys = session_keys(10, 12, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        for t, end in enumerate((4, 8, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        rot_last_segment(tmp_path, 3, 5)
        dst = paged(g, 12)
        res = store.load(keys, dst, range(12))
        # The restore read the window at its end only: stopped at the damage, it holds
        # no window there and serves nothing. The books cut the session at the damaged
        # turn, so the next restore ends at turn 1 and reads its window.
        assert (res.num_blocks, res.damaged_segments) == (0, 1)
        dst = paged(g, 12)
        res = store.load(keys, dst, range(12))
    assert (res.num_blocks, res.damaged_segments) == (8, 0)
    assert_windowed(dst, src, list(range(12)), 8)


@pytest.mark.parametrize("release", [True, False])
def test_windows_of_4k_blocks_are_read_straight_into_their_slots(
        tmp_path: Path, release: bool) -> None:
    g = WINDOWED_4K
    assert g.layer_block_bytes == (8192, 4096, 4096) and g.layer_window_blocks == (0, 2, 2)
    src = paged(g, 12, seed=11)
    keys = session_keys(11, 12, g)
    slots = list(range(15, 3, -1))
    cfg = small_config(f"store.release_old_windows={str(release).lower()}",
                       "store.release_windows_at_once=true")
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        for t, end in enumerate((5, 9, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
        # A hit ending at turn 1 (block 9) needs turn 1's rows: kept unless released.
        branch = store.lookup(keys[:9]).num_blocks
    assert (res.num_blocks, res.read_path, res.damaged_segments) == (12, "zero-copy", 0)
    assert torch.equal(dst[0][slots], src[0])
    # The window at the hit's end, the last 2 blocks, is all the restore reads of the
    # sliding layers: turns 0 and 1 end at or before 12 - 2, so no window ending at 12
    # reads their rows, released or kept.
    held = [10, 11]
    for layer in (1, 2):
        assert torch.equal(dst[layer][[slots[b] for b in held]], src[layer][held])
        others = [slots[b] for b in range(12) if b not in held]
        assert not dst[layer][others].any()
    assert branch == (0 if release else 9)  # released: turn 0's rows are gone too


def test_a_hit_ending_at_an_older_turn_is_served_with_its_window(tmp_path: Path) -> None:
    # The default: superseded rows stay until the SSD needs the space, so a branch off
    # turn 1 (a sub-agent, a retry) restores every block up to it, its window included,
    # byte for byte; the restore reads the sliding rows of that window only.
    g = WINDOWED_4K
    src = paged(g, 12, seed=12)
    keys = session_keys(12, 12, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        for t, end in enumerate((5, 9, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        dst = paged(g, 12)
        res = store.load(keys[:9], dst, range(12))
    assert (res.num_blocks, res.damaged_segments) == (9, 0)
    assert torch.equal(dst[0][:9], src[0][:9])
    for layer in (1, 2):
        assert torch.equal(dst[layer][[7, 8]], src[layer][[7, 8]])
        assert not dst[layer][[0, 1, 2, 3, 4, 5, 6, 9, 10, 11]].any()


def test_a_stored_prompt_ending_inside_a_turn_writes_its_window_there(
        tmp_path: Path) -> None:
    # Session a stores 9 blocks in one turn. Session b's prompt is a's first 5 blocks
    # (a shared prefix, a retry): all stored, but a holds no window at 5, so b's lookup
    # is cut back to nothing and b recomputes. b's store then writes the window's 2
    # blocks there as a segment of its own (blocks 3-4), and the next prompt ending at
    # 5 restores all 5 blocks, its window from b's segment, byte for byte.
    g = WINDOWED_4K
    src = paged(g, 12, seed=13)
    keys = session_keys(13, 12, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store.store_turn("a", keys[:9], src, range(9), TurnSignals(0, 0))
        assert store.lookup(keys[:5]).num_blocks == 0
        res = store.store_turn("b", keys[:5], src, range(5), TurnSignals(0, 0))
        assert (res.num_blocks, res.first_block) == (2, 3)
        assert store.lookup(keys[:5]).num_blocks == 5
        assert store.lookup(keys[:9]).num_blocks == 9  # a's own hit is unchanged
        again = store.store_turn("c", keys[:5], src, range(5), TurnSignals(0, 0))
        assert again.num_blocks == 0  # held now: nothing more to write
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:  # a restart
        dst = paged(g, 12)
        got = store.load(keys[:5], dst, range(12))
    assert (got.num_blocks, got.damaged_segments) == (5, 0)
    assert torch.equal(dst[0][:5], src[0][:5])
    for layer in (1, 2):
        assert torch.equal(dst[layer][[3, 4]], src[layer][[3, 4]])
        assert not dst[layer][[0, 1, 2, *range(5, 12)]].any()


def branch_keys(g: KVGeometry, shared: int, total: int, seed: int) -> list[bytes]:
    """Keys of a prompt of ``total`` blocks whose first ``shared`` are session 13's."""
    bs = g.tokens_per_block
    tokens = [13 * 1_000_003 + i for i in range(shared * bs)]
    tokens += [seed * 1_000_003 + i for i in range((total - shared) * bs)]
    return chain_block_keys(tokens, bs, "test-model")


@pytest.mark.parametrize(("rows", "stride"), [("branches", 0), ("turn-ends", 0),
                                             ("branches", 7 * 16)])
def test_a_prompt_branching_off_a_stored_prefix_keeps_its_window_at_the_branch(
        tmp_path: Path, rows: str, stride: int) -> None:
    # Session a stores 9 blocks. Session b shares a's first 5 blocks (a system prompt)
    # and branches: a holds no window at 5, so b's hit is cut back to nothing. b's store
    # starts a window (2 blocks) before the branch and keeps that window's sliding rows:
    # a third prompt sharing the same 5 blocks restores byte for byte (after a restart
    # too); one ending inside b's turn is cut back to the branch, or served at a
    # multiple of store.window_row_stride_tokens; the sliding layers are read from the window
    # at the hit's end only. With turn-end rows neither is served.
    g = WINDOWED_4K
    keys_a = session_keys(13, 9, g)
    keys_b, keys_c = branch_keys(g, 5, 9, 14), branch_keys(g, 5, 8, 15)
    assert keys_b[:5] == keys_a[:5] != keys_b[:6]
    src_a, src_b = paged(g, 9, seed=13), paged(g, 9, seed=14)
    for a, b in zip(src_a, src_b, strict=True):
        b[:5] = a[:5]
    cfg = small_config(f"store.window_rows={rows}", f"store.window_row_stride_tokens={stride}")
    branched = rows == "branches"
    inside = 7 if stride else 5 if branched else 0
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        store.store_turn("a", keys_a, src_a, range(9), TurnSignals(0, 0))
        assert store.lookup(keys_b).num_blocks == 0
        res = store.store_turn("b", keys_b, src_b, range(9), TurnSignals(0, 0))
        assert (res.first_block, res.num_blocks) == ((3, 6) if branched else (5, 4))
        assert store.lookup(keys_c).num_blocks == (5 if branched else 0)
        assert store.lookup(keys_b[:7]).num_blocks == inside
        assert store.lookup(keys_b[:8]).num_blocks == (8 if stride else inside)  # rows 6-7 held
        assert store.lookup(keys_b).num_blocks == 9
        assert store.lookup(keys_a).num_blocks == 9  # a's own hit is unchanged
    if not branched:
        return
    with FlatCakeStore.open(tmp_path, g, cfg) as store:  # a restart
        for keys, end, src in ((keys_c, 5, src_a), (keys_b, inside, src_b),
                               (keys_b, 9, src_b)):
            dst = paged(g, 12)
            got = store.load(keys[:end], dst, range(12))
            assert (got.num_blocks, got.damaged_segments) == (end, 0)
            assert torch.equal(dst[0][:end], src[0][:end])
            for layer in (1, 2):
                assert torch.equal(dst[layer][end - 2:end], src[layer][end - 2:end])
                assert not dst[layer][[*range(end - 2), *range(end, 12)]].any()
