"""Byte-exact store -> load round trips over random geometries, layouts and placements."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flatcake.control.address import Medium
from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

geometries = st.one_of(
    st.builds(KVGeometry, num_layers=st.integers(1, 5), tokens_per_block=st.integers(1, 8),
              num_kv_heads=st.integers(1, 3), head_dim=st.integers(1, 24),
              dtype=st.sampled_from(["float16", "bfloat16", "float32", "uint8"])),
    st.builds(KVGeometry, num_layers=st.integers(1, 4), tokens_per_block=st.integers(1, 8),
              mla_latent_dim=st.integers(1, 40), dtype=st.sampled_from(["float16", "uint8"])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=geometries, layout=st.sampled_from(["blocks", "kv_blocks"]),
       turns=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=4),
       seed=st.integers(0, 10_000))
def test_turns_restore_byte_exact(g: KVGeometry, layout: str,
                                  turns: list[tuple[int, bool]], seed: int) -> None:
    if g.is_mla:
        layout = "blocks"
    rng = random.Random(seed)
    total = sum(n for n, _ in turns)
    num_slots = total + 3
    src = random_kv(g, num_slots, layout, seed)
    src_slots = rng.sample(range(num_slots), total)  # where the engine held each block
    keys = session_keys(seed, total, g)
    with tempfile.TemporaryDirectory() as root, \
            FlatCakeStore.open(root, g, small_config()) as store:
        done = 0
        for turn, (n, to_memory) in enumerate(turns):
            signals = TO_MEMORY if to_memory and turn > 0 else TO_SSD
            res = store.store_turn("s", keys[:done + n], src, src_slots[:done + n], signals)
            assert (res.num_blocks, res.first_block) == (n, done)
            assert res.medium == (Medium.MEMORY if signals is TO_MEMORY else Medium.SSD)
            done += n
        dst = empty_kv(g, num_slots, layout)
        dst_slots = rng.sample(range(num_slots), total)
        result = store.load(keys, dst, dst_slots)
    assert result.num_blocks == total and result.damaged_segments == 0
    for layer in range(g.num_layers):
        for i in range(total):
            assert block_bytes(dst, layer, dst_slots[i], layout) == \
                block_bytes(src, layer, src_slots[i], layout)
    # Slots the restore did not target stay untouched.
    untouched = set(range(num_slots)) - set(dst_slots)
    for slot in untouched:
        assert not any(block_bytes(dst, layer, slot, layout).strip(b"\0")
                       for layer in range(g.num_layers))


def test_longer_request_loads_only_the_stored_prefix(tmp_path: Path) -> None:
    src = random_kv(SMALL, 16)
    keys = session_keys(1, 12)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys[:5], src, range(5), TO_SSD)
        store.store_turn("s", keys[:8], src, range(8), TO_MEMORY)
        hit = store.lookup(keys)
        assert (hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks) == (8, 3, 5)
        dst = empty_kv(SMALL, 16)
        res = store.load(keys, dst, range(4, 16))
        assert (res.num_blocks, res.num_memory_blocks, res.num_ssd_blocks) == (8, 3, 5)
        for layer in range(SMALL.num_layers):
            for i in range(8):
                assert block_bytes(dst, layer, 4 + i, "kv_blocks") == \
                    block_bytes(src, layer, i, "kv_blocks")
            assert not dst[layer][:, 12:].any()  # blocks 8.. were not stored


def test_prefix_ending_inside_a_segment_is_verified_and_exact(tmp_path: Path) -> None:
    # Another request shares only the first 3 of a 7-block segment: the restore reads
    # the whole segment layer (to check its crc) but scatters only the 3 shared blocks.
    src = random_kv(SMALL, 16)
    keys = session_keys(2, 7)
    other = keys[:3] + session_keys(3, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys, src, range(7), TO_SSD)
        dst = empty_kv(SMALL, 16)
        res = store.load(other, dst, range(9, 16))
    assert res.num_blocks == 3 and res.num_ssd_blocks == 3
    assert res.useful_bytes == 3 * SMALL.block_bytes
    assert res.bytes_read >= 7 * SMALL.block_bytes
    for layer in range(SMALL.num_layers):
        for i in range(3):
            assert block_bytes(dst, layer, 9 + i, "kv_blocks") == \
                block_bytes(src, layer, i, "kv_blocks")
        assert not dst[layer][:, 12:].any() and not dst[layer][:, :9].any()


def test_nothing_new_writes_nothing(tmp_path: Path) -> None:
    src = random_kv(SMALL, 8)
    keys = session_keys(4, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys, src, range(4), TO_SSD)
        again = store.store_turn("s", keys, src, range(4), TO_SSD)
    assert (again.num_blocks, again.medium, again.bytes_written) == (0, None, 0)


@pytest.mark.parametrize("layout", ["blocks", "kv_blocks"])
def test_store_and_load_across_layouts(tmp_path: Path, layout: str) -> None:
    # The bytes of a block are the same whichever layout holds them.
    other = "blocks" if layout == "kv_blocks" else "kv_blocks"
    src = random_kv(SMALL, 6, layout)
    keys = session_keys(5, 6)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys, src, range(6), TO_SSD)
        dst = empty_kv(SMALL, 6, other)
        assert store.load(keys, dst, range(6)).num_blocks == 6
    for layer in range(SMALL.num_layers):
        for i in range(6):
            assert block_bytes(dst, layer, i, other) == block_bytes(src, layer, i, layout)
