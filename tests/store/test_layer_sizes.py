"""Models whose layers differ in size: a geometry of three layer kinds round-trips byte
for byte through the staging and the zero-copy read paths, from SSD and from host
memory, before and after a restart, in at most layers x turns read commands; DeepSeek-V4's
layer kinds as the vLLM connector stores them restore every compressed block and each
window's engine blocks, with windows read for the last turn only; and a session file
written by the previous format version still reads."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    ALIGNED_KINDS,
    THREE_KINDS,
    paged,
    rot_last_segment,
    session_keys,
    small_config,
    store_three_turns,
)

FIXTURES = Path(__file__).parent.parent / "cio" / "fixtures"

def assert_restored(dst: list[torch.Tensor], src: list[torch.Tensor], slots: list[int]
                    ) -> None:
    for layer, (d, s) in enumerate(zip(dst, src, strict=True)):
        assert torch.equal(d[slots], s[:len(slots)]), f"layer {layer}"
        rest = sorted(set(range(d.shape[0])) - set(slots))
        assert not d[rest].any(), f"layer {layer}: a slot outside the restore was written"


def test_three_layer_sizes_round_trip_through_the_staging_path(tmp_path: Path) -> None:
    g = THREE_KINDS
    assert sorted(set(g.layer_block_bytes)) == [584, 4096, 8192]
    src = paged(g, 12, seed=1)
    keys = session_keys(1, 12, g)
    slots = [13, 2, 7, 0, 15, 4, 9, 1, 12, 3, 6, 10]
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store_three_turns(store, keys, src)
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.num_ssd_blocks, res.num_memory_blocks) == (12, 9, 3)
        assert res.read_path == "staging"
        assert res.staging_reason == "a block part of 584 bytes is not a multiple of 4096"
        assert res.useful_bytes == 9 * g.block_bytes
        assert res.memory_bytes == 3 * g.block_bytes
        assert res.commands <= g.num_layers * 2  # two SSD turns
        assert res.damaged_segments == 0
        assert_restored(dst, src, slots)
    # After a restart the headers (per-layer sizes) are read back from the files.
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
        # Host memory does not survive a restart: the prefix ends where turn 1 was.
        assert (res.num_blocks, res.num_ssd_blocks, res.damaged_segments) == (5, 5, 0)
        assert res.commands <= g.num_layers
        assert_restored(dst, src, slots[:5])


def test_layers_of_4k_multiple_sizes_are_read_straight_into_their_slots(
        tmp_path: Path) -> None:
    g = ALIGNED_KINDS
    assert sorted(set(g.layer_block_bytes)) == [4096, 8192, 12288]
    src = paged(g, 12, seed=2)
    keys = session_keys(2, 12, g)
    slots = list(range(15, 3, -1))
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store_three_turns(store, keys, src)
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.read_path, res.staging_reason) == (12, "zero-copy", "")
        assert res.commands <= g.num_layers * 2
        assert_restored(dst, src, slots)


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_of_a_previous_format_version_still_reads(tmp_path: Path, version: int
                                                          ) -> None:
    # tests/cio/fixtures/v<N>-session.fcs: a session file written by format version N
    # (file id 4 + N, 2 layers x 1024 B blocks, turns of 3 and 2 blocks; block b's key
    # is sha256(b"k<b>"), data byte i of turn t is (7 i + t) % 251).
    g = KVGeometry(num_layers=2, tokens_per_block=4, mla_latent_dim=256, dtype="uint8")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    shutil.copy(FIXTURES / f"v{version}-session.fcs", sessions / f"{4 + version:016x}.fcs")
    keys = [hashlib.sha256(b"k%d" % b).digest() for b in range(5)]
    cfg = small_config("store.session_file_bytes=1048576")
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        assert store.lookup(keys).num_blocks == 5
        dst = paged(g, 5)
        res = store.load(keys, dst, range(5))
    assert (res.num_blocks, res.damaged_segments) == (5, 0)
    for turn, (first, n) in enumerate(((0, 3), (3, 2))):
        data = bytes((i * 7 + turn) % 251 for i in range(2 * n * 1024))
        for layer in range(2):
            want = data[layer * n * 1024:(layer + 1) * n * 1024]
            assert dst[layer][first:first + n].numpy().tobytes() == want


def test_a_rotted_byte_in_a_small_layer_cuts_the_restore_there(tmp_path: Path) -> None:
    # One bit flipped in the 584 B layer of the last SSD turn: that turn fails its crc32
    # and is a miss; the turns before it are served byte for byte. (Layers before the
    # rotted one were already scattered past the cut: the engine uses only num_blocks.)
    g = THREE_KINDS
    src = paged(g, 12, seed=4)
    keys = session_keys(4, 12, g)
    slots = list(range(12))
    with FlatCakeStore.open(tmp_path, g, small_config()) as store:
        store_three_turns(store, keys, src)
        rot_last_segment(tmp_path, 4, 3)
        dst = paged(g, 12)
        res = store.load(keys, dst, slots)
    assert (res.num_blocks, res.damaged_segments) == (8, 1)
    for layer, (d, s) in enumerate(zip(dst, src, strict=True)):
        assert torch.equal(d[:8], s[:8]), f"layer {layer}"


# DeepSeek-V4's layer kinds as the vLLM connector stores them (one layer of each; sizes
# of vLLM 0.32's pages, docs/hybrid.md): 256-token blocks; a sliding window keeping 2
# engine blocks of 64 tokens, compressed latents and indexer keys (one state per 4 or 128
# tokens), compressor states keeping 2 blocks of 4 tokens and 16 of 8. No size is a
# multiple of 4 KiB.
DSV4_AS_SERVED = KVGeometry(
    num_layers=7, tokens_per_block=256, dtype="uint8", name="dsv4-as-served",
    groups=(LayerGroup(1, 2 * 37440, 256, 128, "sliding"), LayerGroup(1, 37440, 256, kind="c4"),
            LayerGroup(1, 8640, 256, kind="c4"), LayerGroup(1, 1728, 256, kind="c128"),
            LayerGroup(1, 2 * 32832, 256, 8, "sliding"),
            LayerGroup(1, 2 * 8640, 256, 8, "sliding"),
            LayerGroup(1, 16 * 32832, 256, 128, "sliding")))


def test_deepseek_v4_kinds_as_served_restore_every_block_and_each_window(tmp_path: Path
                                                                          ) -> None:
    g = DSV4_AS_SERVED
    assert g.layer_window_blocks == (1, 0, 0, 0, 1, 1, 1)
    src = paged(g, 12, seed=5)
    keys = session_keys(5, 12, g)
    slots = [13, 2, 7, 0, 15, 4, 9, 1, 12, 3, 6, 10]
    with FlatCakeStore.open(tmp_path, g, small_config("store.session_file_bytes=67108864")
                            ) as store:
        store_three_turns(store, keys, src)
        dst = paged(g, 16)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.num_ssd_blocks, res.damaged_segments) == (12, 9, 0)
        assert res.read_path == "staging"
        assert res.staging_reason.endswith("is not a multiple of 4096")
        # Every full layer of each SSD turn, each window of the last turn only.
        assert res.commands <= 3 * 2 + 4
    for layer, (d, s) in enumerate(zip(dst, src, strict=True)):
        held = slots[-1:] if g.layer_window_blocks[layer] else slots
        assert torch.equal(d[held], s[12 - len(held):12]), f"layer {layer}"
        # A window's rows of an earlier turn may land too: its own block's bytes.
        for block, slot in enumerate(slots):
            assert not d[slot].any() or torch.equal(d[slot], s[block]), (layer, block)
        rest = sorted(set(range(16)) - set(slots))
        assert not d[rest].any(), f"layer {layer}: a slot outside the restore was written"
