"""Bytes for the store and connector worlds: a paged KV whose block contents are a
function of the block id (so a restore is checked byte for byte), lanes of its slots
(one per live request), and rot on disk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from flatcake.cio.format import session_file_name
from flatcake.control.index import Segment
from flatcake.geometry import KVGeometry

LANE_SLOTS = 64  # slots per live request (the script's longest prompt is 60 blocks)


def block_bytes(g: KVGeometry, block_id: int, layer: int) -> torch.Tensor:
    """The bytes of block ``block_id``'s layer ``layer`` (what a prefill computes)."""
    n = g.block_bytes_per_layer
    return ((torch.arange(n) + block_id * 7 + layer * 13) % 251).to(torch.uint8)


class PagedBlocks:
    """A paged KV, ``(slots, block bytes of one layer)`` uint8 per layer, in lanes."""

    def __init__(self, g: KVGeometry, lanes: int = 8) -> None:
        self.g = g
        self.tensors = [torch.zeros((lanes * LANE_SLOTS, g.block_bytes_per_layer),
                                    dtype=torch.uint8) for _ in range(g.num_layers)]
        self._free = list(range(lanes))

    def take_lane(self) -> list[int]:
        lane = self._free.pop(0)
        return list(range(lane * LANE_SLOTS, (lane + 1) * LANE_SLOTS))

    def give_back(self, slots: Sequence[int]) -> None:
        self._free.append(slots[0] // LANE_SLOTS)

    def compute(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        """The forward pass computed ``block_ids`` into ``slots``."""
        for layer, t in enumerate(self.tensors):
            for slot, b in zip(slots, block_ids, strict=False):
                t[slot] = block_bytes(self.g, b, layer)

    def holds(self, slots: Sequence[int], block_ids: Sequence[int]) -> bool:
        """Whether ``slots`` hold exactly ``block_ids``' bytes, every layer."""
        return all(torch.equal(t[slot], block_bytes(self.g, b, layer))
                   for layer, t in enumerate(self.tensors)
                   for slot, b in zip(slots, block_ids, strict=False))


def rot(sessions_dir: Path, seg: Segment, header: bool) -> Path:
    """Flip one byte of ``seg``'s layer 1 in its session file (and, with ``header``,
    one of the file header); returns the file."""
    path = sessions_dir / session_file_name(int(seg.file_id or 0))
    spots = [int(seg.file_offset or 0) + seg.layout.layer_offset(1) + 100]
    if header:
        spots.append(100)
    with open(path, "r+b") as f:
        for pos in spots:
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ 0xFF]))
    return path
