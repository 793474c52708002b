"""State-space layers (Mamba-2, Gated DeltaNet): a segment holds each state layer's
checkpoint at its end (and at a branch) beside every block of the attention layers, in
the same file and the same merged read; a restore hands the engine the state at the
hit's end, byte for byte, from SSD and memory and after a restart; a hit ending where no
state is held is cut back to the last position whose state is; a rotted state byte is
never served."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flatcake.cio.filescan import scan_session_file
from flatcake.geometry import KVGeometry, LayerGroup, state_bytes
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import (
    branch_keys,
    paged,
    rot_last_segment,
    session_keys,
    small_config,
    store_three_turns,
)
from tests.store.window_helpers import the_file

FULL, STATE = (0, 1), (2, 3)


def hybrid(ssm: tuple[int, ...]) -> KVGeometry:
    """Two attention layers (8 KiB a 16-token block) and two state layers checkpointed
    every block: a bf16 conv state of 3 x 96 and a float32 SSM state of ``ssm``."""
    return KVGeometry(
        num_layers=4, tokens_per_block=16, dtype="uint8", name="hybrid",
        groups=(LayerGroup(2, 512, kind="full"),
                LayerGroup.state(2, ((3, 96), ssm), ("bfloat16", "float32"), 16,
                                 kind="gdn")))


# 576 + 4,096 B states (not a multiple of 4 KiB: the staging path); 576 + 3,520 B.
GEOMETRIES = {"staging": hybrid((4, 16, 16)), "4k": hybrid((2, 20, 22))}


def assert_restored(dst: list[torch.Tensor], src: list[torch.Tensor], slots: list[int],
                    end: int, copied: tuple[int, ...] = ()) -> None:
    """Attention layers: every block before ``end``; state layers: the checkpoint at
    ``end`` (block ``end - 1``'s) and nothing else, but for ``copied``: blocks a memory
    segment's copy may hand over with their own state (it copies its rows whole)."""
    for layer in FULL:
        assert torch.equal(dst[layer][slots[:end]], src[layer][:end]), layer
    for layer in STATE:
        assert torch.equal(dst[layer][slots[end - 1]], src[layer][end - 1]), layer
        for b in copied:
            assert torch.equal(dst[layer][slots[b]], src[layer][b]) or \
                not dst[layer][slots[b]].any(), (layer, b)
        assert not dst[layer][[slots[b] for b in range(end - 1)
                               if b not in copied]].any(), layer


def test_a_state_group_is_one_checkpoint_per_block() -> None:
    g = GEOMETRIES["staging"]
    assert state_bytes(((3, 96), (4, 16, 16)), ("bfloat16", "float32")) == 4672
    assert g.layer_block_bytes == (8192, 8192, 4672, 4672)
    assert g.layer_window_blocks == (0, 0, 1, 1)
    assert [grp.is_state for grp in g.layer_groups] == [False, True]
    # A coarser block still holds one checkpoint, the state at its end.
    assert g.with_block_size(64).layer_block_bytes == (32768, 32768, 4672, 4672)
    assert g.restore_bytes(5) == 5 * 2 * 8192 + 2 * 4672
    with pytest.raises(ValueError, match="one dtype per shape"):
        state_bytes(((3, 96),), ("bfloat16", "float32"))
    with pytest.raises(ValueError, match="positive shape"):
        state_bytes(((3, 0),), ("bfloat16",))


@pytest.mark.parametrize("kind", sorted(GEOMETRIES))
def test_each_turn_keeps_one_state_per_layer_restored_byte_for_byte(
        tmp_path: Path, kind: str) -> None:
    g = GEOMETRIES[kind]
    size = g.layer_block_bytes[2]
    src = paged(g, 12, seed=31)
    keys = session_keys(31, 12, g)
    slots = [13, 2, 7, 0, 15, 4, 9, 1, 12, 3, 6, 10]
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store_three_turns(store, keys, src)  # 5 blocks SSD, 3 memory, 4 SSD
        assert store.fsck().clean  # every state row's crc32 checks out on disk
        _, segs, _ = scan_session_file(the_file(tmp_path), verify_data=True)
        for seg, n in zip(segs, (5, 4), strict=True):  # one state row per layer
            lay = seg.header.layout
            assert [lay.layer_rows(layer) for layer in range(4)] == [n, n, 1, 1]
        for end in (5, 8, 12):  # each turn's end holds its state
            dst = paged(g, 16)
            res = store.load(keys[:end], dst, slots)
            assert (res.num_blocks, res.damaged_segments) == (end, 0)
            assert_restored(dst, src, slots, end, copied=(7,))
            if end == 5:  # SSD alone: the attention rows and the state at the end
                assert res.useful_bytes == 5 * 2 * 8192 + 2 * size


@pytest.mark.parametrize("kind", sorted(GEOMETRIES))
def test_a_hit_ending_where_no_state_is_held_is_cut_back(tmp_path: Path, kind: str
                                                         ) -> None:
    g = GEOMETRIES[kind]
    src = paged(g, 12, seed=32)
    keys = session_keys(32, 12, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        for t, end in enumerate((5, 9, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        # Every attention block is held; the states at 5, 9 and 12 only.
        assert [store.lookup(keys[:n]).num_blocks for n in range(1, 13)] == \
            [0, 0, 0, 0, 5, 5, 5, 5, 9, 9, 9, 12]
    slots = list(range(15, 3, -1))
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:  # a restart
        dst = paged(g, 16)
        res = store.load(keys[:11], dst, slots)
        assert (res.num_blocks, res.damaged_segments) == (9, 0)
        assert_restored(dst, src, slots, 9)
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
    assert (res.num_blocks, res.damaged_segments) == (12, 0)
    # One merged plan over three segments: each segment's layers are one range (the
    # earlier turns' states lie between its attention rows and are read through, never
    # handed over); only the state at the end reaches the engine's slots.
    assert res.useful_bytes == 12 * 2 * 8192 + 3 * 2 * g.layer_block_bytes[2]
    assert res.commands <= 2 * 3
    assert_restored(dst, src, slots, 12)


def test_a_rotted_state_byte_is_never_served(tmp_path: Path) -> None:
    g = GEOMETRIES["staging"]
    src = paged(g, 12, seed=33)
    keys = session_keys(33, 12, g)
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        for t, end in enumerate((4, 8, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        rot_last_segment(tmp_path, 3, 100)  # the last turn's state of layer 3
        dst = paged(g, 12)
        res = store.load(keys, dst, range(12))
        assert (res.num_blocks, res.damaged_segments) == (0, 1)
        assert not dst[3].any()
        # The books cut the session at the damaged turn: turn 1's state serves next.
        dst = paged(g, 12)
        res = store.load(keys, dst, range(12))
    assert (res.num_blocks, res.damaged_segments) == (8, 0)
    assert_restored(dst, src, list(range(12)), 8)


def test_a_prompt_branching_off_a_stored_prefix_keeps_the_state_at_the_branch(
        tmp_path: Path) -> None:
    # Session a stores 9 blocks; b shares its first 5 (a system prompt) and branches:
    # a holds no state at 5, so b recomputes, and b's turn keeps the state at the
    # branch beside its own end. A third prompt sharing the 5 blocks restores them,
    # the state at 5 from b's segment, byte for byte.
    g = GEOMETRIES["staging"]
    keys_a, keys_b = session_keys(1, 9, g), branch_keys(1, 5, 2, 9, g)
    keys_c = branch_keys(1, 5, 3, 8, g)
    src_a, src_b = paged(g, 9, seed=34), paged(g, 9, seed=35)
    for a, b in zip(src_a, src_b, strict=True):
        b[:5] = a[:5]
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store.store_turn("a", keys_a, src_a, range(9), TurnSignals(0, 0))
        assert store.lookup(keys_c).num_blocks == 0
        res = store.store_turn("b", keys_b, src_b, range(9), TurnSignals(0, 0))
        assert (res.first_block, res.num_blocks) == (4, 5)
        assert store.lookup(keys_c).num_blocks == 5
        dst = paged(g, 12)
        got = store.load(keys_c[:5], dst, range(12))
    assert (got.num_blocks, got.damaged_segments) == (5, 0)
    assert_restored(dst, src_a, list(range(12)), 5)
