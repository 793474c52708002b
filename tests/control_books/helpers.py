"""Segment builders shared by the control-plane tests."""

from __future__ import annotations

from collections.abc import Sequence

from flatcake.control.address import Medium, encode_address
from flatcake.control.index import Segment
from flatcake.plan.layout import SegmentLayout


def key(i: int) -> bytes:
    """A distinct 32-byte key per int."""
    return i.to_bytes(32, "big")


def keys(start: int, stop: int) -> list[bytes]:
    return [key(i) for i in range(start, stop)]


def ssd_segment(segment_id: int, ks: Sequence[bytes], *, num_layers: int = 2,
                block_bytes: int = 64, file_id: int = 0, file_offset: int = 4096,
                base_offset: int = 0, session_id: str = "s", turn: int = 0) -> Segment:
    layout = SegmentLayout.for_ssd(len(ks), num_layers, block_bytes)
    return Segment(segment_id, session_id, Medium.SSD,
                   encode_address(Medium.SSD, 0, base_offset + file_offset), layout,
                   tuple(ks), turn, file_id, file_offset)


def memory_segment(segment_id: int, ks: Sequence[bytes], *, num_layers: int = 2,
                   block_bytes: int = 64, arena_offset: int = 0, session_id: str = "s",
                   turn: int = 0) -> Segment:
    layout = SegmentLayout.for_memory(len(ks), num_layers, block_bytes)
    return Segment(segment_id, session_id, Medium.MEMORY,
                   encode_address(Medium.MEMORY, 0, arena_offset), layout, tuple(ks), turn)
