"""The device-into-paged-KV row: the device file's blocks land in the slots the table
names (K and V halves in their planes), and a destination that a zero-copy restore could
not use is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flatcake.bench import device as dev
from flatcake.bench.paged_ceiling import paged_destination
from flatcake.bench.source import empty_kv, shuffled_slots
from flatcake.cio.direct import aligned_buffer
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader

LAYERS, BLOCKS, SLOTS, BBL, CHUNK = 3, 8, 11, 16384, 65536


def _file(direct_dir: Path) -> tuple[str, bytes]:
    path = str(direct_dir / "device.bin")
    dev.write_sequential(path, LAYERS * BLOCKS * BBL, chunk_bytes=CHUNK, in_flight=2)
    with open(path, "rb") as f:
        return path, f.read()


@pytest.mark.parametrize("kv_layout", ["blocks", "kv_blocks"])
def test_blocks_land_in_their_slots(direct_dir: Path, kv_layout: str) -> None:
    path, data = _file(direct_dir)
    if kv_layout == "blocks":
        caches = empty_kv(LAYERS, SLOTS, BBL)
    else:
        caches = [aligned_buffer(SLOTS * BBL, pin=False).zero_().view(2, SLOTS, BBL // 2)
                  for _ in range(LAYERS)]
    paged = PagedKV(caches, BBL, kv_layout=kv_layout)
    table = shuffled_slots(BLOCKS, SLOTS, seed=3)
    reader = DirectReader(2)
    try:
        dest, why = paged_destination(reader, paged, table, CHUNK, len(data) // CHUNK)
    finally:
        reader.close()
    assert why == "" and dest is not None
    t = dev.read_sequential(path, chunk_bytes=CHUNK, in_flight=3, destination=dest)
    assert t.num_bytes == len(data) and t.num_commands == len(data) // CHUNK
    for layer in range(LAYERS):
        for b in range(BLOCKS):
            at = (layer * BLOCKS + b) * BBL
            slot = int(table[b])
            if kv_layout == "blocks":
                got = bytes(caches[layer][slot].numpy())
            else:
                got = bytes(torch.cat([caches[layer][0, slot], caches[layer][1, slot]]).numpy())
            assert got == data[at:at + BBL], (layer, b)


def test_refused_where_zero_copy_is() -> None:
    bbl = 3000  # not a multiple of 4096: O_DIRECT cannot land blocks in their slots
    paged = PagedKV([torch.zeros(SLOTS, bbl, dtype=torch.uint8)], bbl)
    reader = DirectReader(1)
    try:
        dest, why = paged_destination(reader, paged, torch.arange(4), CHUNK, 1)
        assert dest is None and "3000" in why
        aligned = PagedKV(empty_kv(1, 64, 4096), 4096)
        dest, why = paged_destination(reader, aligned, torch.arange(64), 3 * 4096 + 2048, 1)
        assert dest is None and "not whole" in why
    finally:
        reader.close()
