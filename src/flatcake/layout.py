"""Byte layout of one turn segment (FC-CIO). Pure arithmetic, shared by the control
plane (address allocation), the plans (read planning) and the data plane (file format,
I/O); a leaf beside ``geometry``: it imports nothing of FlatCake, so every floor above
stands on it.

A segment holds one turn's new blocks of one session, layer-major, so layer ``l`` of
the turn is one contiguous range::

    segment_offset
    +-----------------------------+  <- 4 KiB aligned
    | segment header              |  header_bytes (multiple of 4 KiB): fixed fields,
    |  (see cio.format)           |  one key per block, one checksum per layer
    +-----------------------------+  <- data_offset (4 KiB aligned)
    | layer 0: block 0 .. n-1     |  n * block_bytes_per_layer
    | layer 1: block 0 .. n-1     |
    | ...                         |
    | layer L-1: block 0 .. n-1   |
    +-----------------------------+
    | zero padding to 4 KiB       |
    +-----------------------------+  <- segment_offset + total_bytes

Host-memory segments use the same data layout with ``header_bytes == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 4096
KEY_BYTES = 32
"""Keys are stored as fixed 32-byte digests (see ``control.keys``)."""

SEGMENT_FIXED_HEADER_BYTES = 128
"""Fixed part of a segment header, before the per-block keys and per-layer checksums."""


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def segment_header_bytes(num_blocks: int, num_layers: int) -> int:
    """On-disk header size: fixed fields + one key per block + one crc32 per layer."""
    raw = SEGMENT_FIXED_HEADER_BYTES + num_blocks * KEY_BYTES + num_layers * 4
    return align_up(raw)


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """Where every byte of one segment lives, relative to the segment's start.

    Attributes:
        num_blocks: blocks in the segment (one turn's new blocks).
        num_layers: layers per block.
        block_bytes_per_layer: bytes of one block of one layer.
        header_bytes: 0 for host memory, ``segment_header_bytes(...)`` on SSD.
    """

    num_blocks: int
    num_layers: int
    block_bytes_per_layer: int
    header_bytes: int

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise ValueError(f"SegmentLayout.num_blocks must be > 0, got {self.num_blocks}")
        if self.num_layers <= 0:
            raise ValueError(f"SegmentLayout.num_layers must be > 0, got {self.num_layers}")
        if self.block_bytes_per_layer <= 0:
            raise ValueError(
                f"SegmentLayout.block_bytes_per_layer must be > 0, got "
                f"{self.block_bytes_per_layer}"
            )
        if self.header_bytes < 0 or self.header_bytes % ALIGN:
            raise ValueError(
                f"SegmentLayout.header_bytes must be a multiple of {ALIGN}, got "
                f"{self.header_bytes}"
            )

    @classmethod
    def for_ssd(cls, num_blocks: int, num_layers: int, block_bytes_per_layer: int
                ) -> SegmentLayout:
        return cls(num_blocks, num_layers, block_bytes_per_layer,
                   segment_header_bytes(num_blocks, num_layers))

    @classmethod
    def for_memory(cls, num_blocks: int, num_layers: int, block_bytes_per_layer: int
                   ) -> SegmentLayout:
        return cls(num_blocks, num_layers, block_bytes_per_layer, 0)

    @property
    def data_offset(self) -> int:
        return self.header_bytes

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer of the whole segment (= the layer stride)."""
        return self.num_blocks * self.block_bytes_per_layer

    @property
    def data_bytes(self) -> int:
        return self.layer_bytes * self.num_layers

    @property
    def total_bytes(self) -> int:
        return align_up(self.header_bytes + self.data_bytes)

    def layer_offset(self, layer: int) -> int:
        """Start of ``layer`` relative to the segment start."""
        return self.header_bytes + layer * self.layer_bytes

    def block_offset(self, layer: int, block: int) -> int:
        """Start of block ``block`` (0-based within the segment) of ``layer``."""
        return self.layer_offset(layer) + block * self.block_bytes_per_layer
