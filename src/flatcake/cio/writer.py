"""Write path (FC-CIO): gather a turn's new blocks from the paged KV, layer by layer, into
the segment layout, write it with a few large aligned writes, make it durable.

Order of an SSD segment write (the store publishes addresses only after it returns)::

    gather layer 0..L-1 blocks -> aligned buffer (crc32 per layer as bytes land)
    pwrite data  [data_offset, total_bytes)       one write per chunk_bytes
    pwrite header [0, header_bytes)               last: a scan finds the segment only
    fdatasync                                     once its header is there; the layer
                                                  crcs still catch a torn data write
A segment that fits in one chunk is written with a single pwrite of header + data.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flatcake.cio.direct import aligned_buffer, pwrite_all, writable_view
from flatcake.cio.format import (
    FileHeader,
    SegmentHeader,
    crc32,
    encode_file_header,
    encode_segment_header,
)
from flatcake.cio.paged import PagedKV
from flatcake.plan.layout import ALIGN, SegmentLayout, align_up

DEFAULT_WRITE_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class WrittenSegment:
    """A durable SSD segment: where it lives, its header, and how it was written."""

    file_offset: int
    header: SegmentHeader
    total_bytes: int
    write_calls: int


class SegmentWriter:
    """Builds and writes segments through one reusable aligned buffer of at most
    ``chunk_bytes`` (+ one block). Thread-safe: writes are serialised on ``lock``, which
    also guards the buffer; holding ``lock`` from outside holds writes off (fsck)."""

    def __init__(self, chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES) -> None:
        if chunk_bytes < ALIGN or chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, "
                             f"got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.lock = threading.Lock()
        self._buf: torch.Tensor | None = None

    def _buffer(self, num_bytes: int) -> torch.Tensor:
        if self._buf is None or self._buf.numel() < num_bytes:
            self._buf = aligned_buffer(align_up(num_bytes))
        return self._buf

    def write_ssd(self, fd: int, file_offset: int, paged: PagedKV, ids: torch.Tensor,
                  keys: Sequence[bytes], *, file_id: int, seq: int, turn_index: int,
                  first_block: int) -> WrittenSegment:
        """Write blocks ``ids`` of every layer as one segment at ``file_offset`` and
        fdatasync. ``file_offset`` must be 4 KiB aligned and the file's allocation must
        already cover the segment."""
        if file_offset % ALIGN:
            raise ValueError(f"segment file_offset must be 4096-aligned, got {file_offset}")
        n = int(ids.numel())
        layout = SegmentLayout.for_ssd(n, paged.num_layers, paged.block_bytes_per_layer)
        with self.lock:
            if layout.total_bytes <= self.chunk_bytes:
                buf = self._buffer(layout.total_bytes)
                crcs = self._gather_all(paged, ids, layout, buf)
                header = SegmentHeader(file_id, seq, turn_index, first_block, n, layout.num_layers,
                                       layout.block_bytes_per_layer, tuple(keys), crcs)
                raw = encode_segment_header(header)
                buf[:len(raw)].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
                calls = pwrite_all(fd, writable_view(buf[:layout.total_bytes]), file_offset)
            else:
                crcs, calls = self._stream_data(fd, file_offset, paged, ids, layout)
                header = SegmentHeader(file_id, seq, turn_index, first_block, n, layout.num_layers,
                                       layout.block_bytes_per_layer, tuple(keys), crcs)
                raw = encode_segment_header(header)
                buf = self._buffer(len(raw))
                buf[:len(raw)].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
                calls += pwrite_all(fd, writable_view(buf[:len(raw)]), file_offset)
            os.fdatasync(fd)
        return WrittenSegment(file_offset, header, layout.total_bytes, calls)

    @staticmethod
    def _gather_all(paged: PagedKV, ids: torch.Tensor, layout: SegmentLayout,
                    buf: torch.Tensor) -> tuple[int, ...]:
        view = writable_view(buf)
        crcs = []
        for layer in range(layout.num_layers):
            start = layout.layer_offset(layer)
            paged.gather(layer, ids, buf[start:start + layout.layer_bytes])
            crcs.append(crc32(view[start:start + layout.layer_bytes]))
        end = layout.header_bytes + layout.data_bytes
        buf[end:layout.total_bytes].zero_()
        return tuple(crcs)

    def _stream_data(self, fd: int, file_offset: int, paged: PagedKV, ids: torch.Tensor,
                     layout: SegmentLayout) -> tuple[tuple[int, ...], int]:
        """Gather and write the data region in aligned chunks; returns (layer crcs,
        write calls). Blocks are gathered in batches that fit the chunk; the unaligned
        tail of each chunk moves to the front of the buffer for the next one."""
        bbpl = layout.block_bytes_per_layer
        chunk = self.chunk_bytes
        buf = self._buffer(chunk + bbpl + ALIGN)
        view = writable_view(buf)
        fill, written, calls = 0, 0, 0
        crcs = []
        for layer in range(layout.num_layers):
            crc = 0
            block = 0
            while block < layout.num_blocks:
                room = max(1, (chunk + bbpl - fill) // bbpl)
                batch = ids[block:block + room]
                nbytes = int(batch.numel()) * bbpl
                paged.gather(layer, batch, buf[fill:fill + nbytes])
                crc = crc32(view[fill:fill + nbytes], crc)
                fill += nbytes
                block += int(batch.numel())
                if fill >= chunk:
                    calls += pwrite_all(fd, view[:chunk],
                                        file_offset + layout.data_offset + written)
                    written += chunk
                    buf[:fill - chunk].copy_(buf[chunk:fill].clone())
                    fill -= chunk
            crcs.append(crc)
        if fill:
            padded = align_up(fill)
            buf[fill:padded].zero_()
            calls += pwrite_all(fd, view[:padded], file_offset + layout.data_offset + written)
        return tuple(crcs), calls

    @staticmethod
    def write_memory(dest: torch.Tensor, paged: PagedKV, ids: torch.Tensor) -> None:
        """Gather blocks ``ids`` into a host-memory segment (``SegmentLayout.for_memory``:
        layer-major, no header); ``dest`` is that segment's range of the arena."""
        layout = SegmentLayout.for_memory(int(ids.numel()), paged.num_layers,
                                          paged.block_bytes_per_layer)
        if dest.numel() < layout.data_bytes:
            raise ValueError(f"memory segment needs {layout.data_bytes} bytes, destination "
                             f"has {dest.numel()}")
        for layer in range(layout.num_layers):
            start = layout.layer_offset(layer)
            paged.gather(layer, ids, dest[start:start + layout.layer_bytes])


def write_file_header(fd: int, header: FileHeader) -> None:
    """Write a new session file's 4 KiB header at offset 0 (aligned, so O_DIRECT works)
    and make it durable."""
    raw = encode_file_header(header)
    buf = aligned_buffer(len(raw), pin=False)
    buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    pwrite_all(fd, writable_view(buf), 0)
    os.fdatasync(fd)
