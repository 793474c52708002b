"""Write path (FC-CIO): a turn's new blocks from the paged KV, layer by layer, into the
segment layout on disk, with several large writes in flight, made durable once.

Order of an SSD segment write (the store publishes addresses only after it returns)::

    data  [data_offset, total_bytes)   commands of at most chunk_bytes, up to
                                       ``in_flight`` outstanding on the writer's
                                       threads (crc32 per layer as bytes go out)
    wait for every data command
    header [0, header_bytes)           last: a scan finds the segment only once
                                       its header is there; the layer crcs still
    fdatasync                          catch a torn data write (once per turn)

The blocks come from the engine's paged KV (``write_ssd``), or, for a not-yet home
memory reclaim writes back (``placement.not_yet_write_back``), from that home's
host-memory segment (``write_ssd_from_memory``: the same data layout without a header,
``layout``): one write path either way, only the source of the blocks differs
(``_PagedBlocks``, ``_MemoryBlocks``). The data goes out one of two ways, chosen per
write and reported in ``WrittenSegment.write_path``:

- ``"zero-copy"``: when the paged KV is in host memory, page-aligned, and each block
  part (a whole block, or its K and V halves for ``(2, slots, ...)`` tensors) is a
  multiple of 4 KiB, each command is a ``pwritev`` whose iovecs are the slots
  themselves (consecutive slots of a ``blocks`` layout merged), no copy;
- ``"gather"``: otherwise (a GPU paged KV, torch's 64-byte-aligned tensors, small
  blocks, a memory segment written back) blocks are gathered into a ring of huge-page
  aligned buffers and each full buffer is written while the next one is gathered
  (host blocks by ``memmove``, see ``_HostGather``).

A segment that fits in one chunk on the gather path is written with a single pwrite of
header + data. The slots must stay as they are until ``write_ssd`` returns (the same
contract as the gather, which also reads them while the call runs).
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from ctypes import memmove
from dataclasses import dataclass
from typing import Protocol

import torch

from flatcake.cio.crc import BlockCrcs
from flatcake.cio.direct import aligned_buffer, pwrite_all, pwritev_all, writable_view
from flatcake.cio.format import FileHeader, SegmentHeader, encode_file_header, encode_segment_header
from flatcake.cio.paged import PagedKV
from flatcake.layout import ALIGN, SegmentLayout, align_up

DEFAULT_WRITE_CHUNK_BYTES = 16 << 20
DEFAULT_WRITES_IN_FLIGHT = 3
IOV_MAX = 1024  # Linux UIO_MAXIOV: most iovecs one pwritev takes
WRITE_PATHS = ("zero-copy", "gather")


@dataclass(frozen=True, slots=True)
class WrittenSegment:
    """A durable SSD segment: where it lives, its header, and how it was written
    (``write_path``: ``"zero-copy"`` or ``"gather"``, see the module docstring)."""

    file_offset: int
    header: SegmentHeader
    total_bytes: int
    write_calls: int
    write_path: str = "gather"


def zero_copy_write_refusal(paged: PagedKV) -> str:
    """Why a write cannot go straight from ``paged``'s slots ("" when it can)."""
    if paged.device.type != "cpu":
        return f"the paged KV is on {paged.device.type}"
    return paged.direct_io_refusal(ALIGN)


class _InFlight:
    """Commands handed to a thread pool, at most ``limit`` outstanding; counts the
    write calls they made. ``drain`` waits for all of them even when one failed, so no
    write is still running once the segment write returns or raises."""

    def __init__(self, pool: ThreadPoolExecutor, limit: int) -> None:
        self._pool, self._limit = pool, limit
        self._futures: deque[Future[int]] = deque()
        self.calls = 0

    def submit(self, fn: Callable[..., int], *args: object) -> Future[int]:
        while len(self._futures) >= self._limit:
            self.calls += self._futures.popleft().result()
        fut = self._pool.submit(fn, *args)
        self._futures.append(fut)
        return fut

    def drain(self) -> None:
        error: BaseException | None = None
        while self._futures:
            try:
                self.calls += self._futures.popleft().result()
            except BaseException as exc:  # the first error wins, the rest still finish
                error = error or exc
        if error is not None:
            raise error


class SegmentWriter:
    """Builds and writes segments: commands of at most ``chunk_bytes``, up to
    ``in_flight`` outstanding on the writer's own threads, through a ring of
    ``in_flight`` reusable aligned buffers on the gather path. Thread-safe: writes are
    serialised on ``lock``, which also guards the buffers; holding ``lock`` from
    outside holds writes off (fsck)."""

    def __init__(self, chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES,
                 in_flight: int = DEFAULT_WRITES_IN_FLIGHT, *, zero_copy: bool = True) -> None:
        if chunk_bytes < ALIGN or chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, "
                             f"got {chunk_bytes}")
        if not isinstance(in_flight, int) or in_flight < 1:
            raise ValueError(f"in_flight must be an int >= 1, got {in_flight!r}")
        self.chunk_bytes = chunk_bytes
        self.in_flight = in_flight
        self.zero_copy = zero_copy
        self.lock = threading.Lock()
        self._ring: list[torch.Tensor] = []
        self._header_buf: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the writer's threads (a later write starts them again)."""
        with self.lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _flight(self) -> _InFlight:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="flatcake-write")
        return _InFlight(self._pool, self.in_flight)

    def _buffers(self, num_bytes: int, count: int) -> list[torch.Tensor]:
        if len(self._ring) < count or self._ring[0].numel() < num_bytes:
            self._ring = [aligned_buffer(align_up(num_bytes)) for _ in range(count)]
        return self._ring[:count]

    def _header_view(self, raw: bytes) -> memoryview:
        need = align_up(len(raw))
        if self._header_buf is None or self._header_buf.numel() < need:
            self._header_buf = aligned_buffer(need, pin=False)
        buf = self._header_buf[:need]
        buf[:len(raw)].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        buf[len(raw):].zero_()
        return writable_view(buf)

    def write_ssd(self, fd: int, file_offset: int, paged: PagedKV, ids: torch.Tensor,
                  keys: Sequence[bytes], *, file_id: int, seq: int, turn_index: int,
                  first_block: int, layer_window_blocks: tuple[int, ...] = (),
                  ends: tuple[tuple[int, int], ...] = ()) -> WrittenSegment:
        """Write blocks ``ids`` of every layer as one segment at ``file_offset`` and
        fdatasync (a layer with a window in ``layer_window_blocks``: its last blocks
        only, and before each of ``ends``: ``layout.SegmentLayout``). ``file_offset``
        must be 4 KiB aligned and the file's allocation must already cover the
        segment."""
        n = int(ids.numel())
        layout = SegmentLayout.for_ssd(n, paged.layer_block_bytes, layer_window_blocks,
                                       ends=ends)
        return self._write(fd, file_offset, layout, _PagedBlocks(paged, ids), keys,
                           file_id=file_id, seq=seq, turn_index=turn_index,
                           first_block=first_block)

    def write_ssd_from_memory(self, fd: int, file_offset: int, home: torch.Tensor,
                              layout: SegmentLayout, keys: Sequence[bytes], *, file_id: int,
                              seq: int, turn_index: int, first_block: int) -> WrittenSegment:
        """Write a host-memory segment (``home``: its arena range, laid out as
        ``layout``, a ``SegmentLayout.for_memory``) as one SSD segment of the same
        blocks at ``file_offset`` and fdatasync, as ``write_ssd`` does from the paged
        KV. ``home`` must stay as it is until this returns."""
        if layout.header_bytes:
            raise ValueError(f"a memory segment (no header) is written back, got a layout "
                             f"with a {layout.header_bytes}-byte header")
        blocks = _MemoryBlocks(home, layout)
        ssd = SegmentLayout.for_ssd(layout.num_blocks, layout.layer_block_bytes,
                                    layout.layer_window_blocks, ends=layout.ends)
        return self._write(fd, file_offset, ssd, blocks, keys,
                           file_id=file_id, seq=seq, turn_index=turn_index,
                           first_block=first_block)

    def _write(self, fd: int, file_offset: int, layout: SegmentLayout, blocks: _Blocks,
               keys: Sequence[bytes], *, file_id: int, seq: int, turn_index: int,
               first_block: int) -> WrittenSegment:
        """Write ``blocks`` as the SSD segment ``layout`` at ``file_offset`` (module
        docstring: data, then header, then fdatasync)."""
        if file_offset % ALIGN:
            raise ValueError(f"segment file_offset must be 4096-aligned, got {file_offset}")
        n = layout.num_blocks

        def header_of(crcs: list[BlockCrcs]) -> SegmentHeader:
            return SegmentHeader(file_id, seq, turn_index, first_block, n,
                                 layout.layer_block_bytes, tuple(keys),
                                 tuple(c.crc for c in crcs), layout.layer_window_blocks,
                                 tuple(tuple(c.prefixes) for c in crcs), layout.ends)

        with self.lock:
            # Zero-copy sends every slot of every layer: not for a windowed segment.
            slots = blocks if isinstance(blocks, _PagedBlocks) else None
            zero_copy = self.zero_copy and slots is not None and n > 0 and \
                not layout.is_windowed and not zero_copy_write_refusal(slots.paged)
            if not zero_copy and layout.total_bytes <= self.chunk_bytes:
                buf = self._buffers(layout.total_bytes, 1)[0]
                crcs = self._gather_all(blocks, layout, buf)
                header = header_of(crcs)
                raw = encode_segment_header(header)
                buf[:len(raw)].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
                calls = pwrite_all(fd, writable_view(buf[:layout.total_bytes]), file_offset)
            else:
                flight = self._flight()
                try:
                    if zero_copy and slots is not None:
                        crcs = self._send_slots(flight, fd, file_offset, slots.paged,
                                                slots.ids, layout)
                    else:
                        crcs = self._stream_data(flight, fd, file_offset, blocks, layout)
                finally:
                    flight.drain()
                header = header_of(crcs)
                calls = flight.calls + pwrite_all(
                    fd, self._header_view(encode_segment_header(header)), file_offset)
            os.fdatasync(fd)
        return WrittenSegment(file_offset, header, layout.total_bytes, calls,
                              "zero-copy" if zero_copy else "gather")

    @staticmethod
    def _gather_all(blocks: _Blocks, layout: SegmentLayout, buf: torch.Tensor
                    ) -> list[BlockCrcs]:
        view = writable_view(buf)
        crcs = _block_crcs(layout)
        for layer in range(layout.num_layers):
            start = layout.layer_offset(layer)
            end = start + layout.layer_bytes(layer)
            at = start
            for a, b in layout.layer_runs(layer):
                nxt = at + (b - a) * layout.layer_block_bytes[layer]
                blocks.copy(layer, a, b - a, buf[at:nxt])
                at = nxt
            crcs[layer].feed(view[start:end])
        end = layout.header_bytes + layout.data_bytes
        buf[end:layout.total_bytes].zero_()
        return crcs

    def _send_slots(self, flight: _InFlight, fd: int, file_offset: int, paged: PagedKV,
                    ids: torch.Tensor, layout: SegmentLayout) -> list[BlockCrcs]:
        """Zero-copy: ``pwritev`` commands whose iovecs are the slots, in file order;
        each command's share of its layers' crc32s is computed while it is in flight."""
        layers = [writable_view(t) for t in paged.layer_bytes()]
        slots = ids.tolist()

        @functools.cache
        def spans_of(part: int, stride: int, plane: int) -> list[tuple[int, int]]:
            if paged.kv_layout == "blocks":
                return _runs(slots, part)
            return [(at, part) for s in slots for at in (s * stride, plane + s * stride)]

        limit = self.chunk_bytes
        cmd: list[memoryview] = []
        owner: list[int] = []  # layer of each iovec of ``cmd``
        cmd_bytes, pos = 0, file_offset + layout.data_offset
        crcs = _block_crcs(layout)

        def send() -> None:
            # The command goes out first; its crc32 is computed while it flies (both
            # only read the slots).
            flight.submit(pwritev_all, fd, cmd, pos)
            for layer, view in zip(owner, cmd, strict=True):
                crcs[layer].feed(view)

        for layer in range(layout.num_layers):
            mv = layers[layer]
            for at, length in spans_of(*paged.layer_parts[layer]):
                while length:
                    take = min(length, limit - cmd_bytes)
                    cmd.append(mv[at:at + take])
                    owner.append(layer)
                    cmd_bytes += take
                    at += take
                    length -= take
                    if cmd_bytes >= limit or len(cmd) >= IOV_MAX:
                        send()
                        pos += cmd_bytes
                        cmd, owner, cmd_bytes = [], [], 0
        if cmd:
            send()
        return crcs

    def _stream_data(self, flight: _InFlight, fd: int, file_offset: int, blocks: _Blocks,
                     layout: SegmentLayout) -> list[BlockCrcs]:
        """Gather the data region into the ring's buffers, each written as soon as it
        holds ``chunk_bytes`` while the next is gathered. Blocks are gathered in batches
        that fit a buffer; the unaligned tail of a full buffer moves to the front of the
        next one."""
        chunk = self.chunk_bytes
        depth = self.in_flight + 1  # one being gathered, up to in_flight being written
        bufs = self._buffers(chunk + max(layout.layer_block_bytes) + ALIGN, depth)
        views = [writable_view(b) for b in bufs]
        pending: list[Future[int] | None] = [None] * depth
        cur, fill, pos = 0, 0, file_offset + layout.data_offset
        crcs = _block_crcs(layout)
        for layer in range(layout.num_layers):
            bbpl = layout.layer_block_bytes[layer]
            for block, stop in layout.layer_runs(layer):
                while block < stop:
                    room = max(1, (chunk + bbpl - fill) // bbpl)
                    count = min(room, stop - block)
                    nbytes = count * bbpl
                    blocks.copy(layer, block, count, bufs[cur][fill:fill + nbytes])
                    crcs[layer].feed(views[cur][fill:fill + nbytes])
                    fill += nbytes
                    block += count
                    while fill >= chunk:
                        nxt = (cur + 1) % depth
                        waiting = pending[nxt]
                        if waiting is not None:
                            waiting.result()  # its buffer is free again (drain counts it)
                        bufs[nxt][:fill - chunk].copy_(bufs[cur][chunk:fill])
                        pending[cur] = flight.submit(pwrite_all, fd, views[cur][:chunk], pos)
                        pos += chunk
                        cur, fill = nxt, fill - chunk
        if fill:
            padded = align_up(fill)
            bufs[cur][fill:padded].zero_()
            flight.submit(pwrite_all, fd, views[cur][:padded], pos)
        return crcs

    @staticmethod
    def write_memory(dest: torch.Tensor, paged: PagedKV, ids: torch.Tensor,
                     layer_window_blocks: tuple[int, ...] = (),
                     ends: tuple[tuple[int, int], ...] = ()) -> None:
        """Gather blocks ``ids`` into a host-memory segment (``SegmentLayout.for_memory``:
        layer-major, no header); ``dest`` is that segment's range of the arena."""
        copy = MemoryCopy(dest, paged, ids, layer_window_blocks, ends)
        for layer in range(paged.num_layers):
            copy.layer(layer)


class MemoryCopy:
    """Blocks ``ids`` of a paged KV gathered into a host-memory segment
    (``SegmentLayout.for_memory``: layer-major, no header) at ``dest``, one layer per
    ``layer`` call (a restore copies each layer as it lands)."""

    def __init__(self, dest: torch.Tensor, paged: PagedKV, ids: torch.Tensor,
                 layer_window_blocks: tuple[int, ...] = (),
                 ends: tuple[tuple[int, int], ...] = ()) -> None:
        self.layout = SegmentLayout.for_memory(int(ids.numel()), paged.layer_block_bytes,
                                               layer_window_blocks, ends)
        if dest.numel() < self.layout.data_bytes:
            raise ValueError(f"memory segment needs {self.layout.data_bytes} bytes, "
                             f"destination has {dest.numel()}")
        self._dest = dest
        self._blocks = _PagedBlocks(paged, ids)

    def layer(self, layer: int) -> None:
        at = self.layout.layer_offset(layer)
        size = self.layout.layer_block_bytes[layer]
        for a, b in self.layout.layer_runs(layer):
            self._blocks.copy(layer, a, b - a, self._dest[at:at + (b - a) * size])
            at += (b - a) * size


class _Blocks(Protocol):
    """Where a segment write takes its blocks from: ``copy`` puts blocks ``[first, first
    + count)`` of the segment, of ``layer`` (blocks the layer holds), into ``dest`` (a
    contiguous host ``uint8`` tensor of those blocks). Zero-copy sends only a paged
    KV's slots (``_PagedBlocks``)."""

    def copy(self, layer: int, first: int, count: int, dest: torch.Tensor) -> None: ...


class _PagedBlocks:
    """A segment's blocks in the engine's paged KV: slots ``ids``, in segment order."""

    def __init__(self, paged: PagedKV, ids: torch.Tensor) -> None:
        self.paged, self.ids = paged, ids
        self._host = _HostGather(paged, ids)

    def copy(self, layer: int, first: int, count: int, dest: torch.Tensor) -> None:
        if self._host.use[layer]:
            self._host.copy(layer, first, count, dest)
        else:
            self.paged.gather(layer, self.ids[first:first + count], dest)


class _MemoryBlocks:
    """A segment's blocks in a host-memory segment (``home``, laid out as ``layout``,
    a ``SegmentLayout.for_memory``): a layer's blocks are one range of it, copied with
    one ``memmove`` (no torch kernel: see ``_HostGather``)."""

    def __init__(self, home: torch.Tensor, layout: SegmentLayout) -> None:
        if home.device.type != "cpu" or not home.is_contiguous() or \
                home.numel() < layout.data_bytes:
            raise ValueError(f"a memory segment is a contiguous host tensor of at least "
                             f"{layout.data_bytes} bytes, got {home.numel()} on "
                             f"{home.device}")
        self._home, self._layout = home, layout

    def copy(self, layer: int, first: int, count: int, dest: torch.Tensor) -> None:
        size = count * self._layout.layer_block_bytes[layer]
        if dest.device.type != "cpu" or not dest.is_contiguous() or dest.numel() != size:
            raise ValueError(f"gather destination must be a contiguous host tensor of "
                             f"{size} bytes, got {dest.numel()} bytes on {dest.device}")
        at = self._layout.block_offset(layer, first)
        memmove(dest.data_ptr(), self._home.data_ptr() + at, size)


class _HostGather:
    """Copies blocks of a host paged KV with ``memmove`` (ctypes, GIL released): one
    call per run of consecutive slots of a ``blocks`` layout, two per block (K, V) of a
    ``kv_blocks`` one. No torch kernel: torch's index kernels spread a copy over its
    intra-op threads, which costs ~3x the CPU of a plain copy on a busy 2-core box
    (0.38-0.43 against 0.12-0.13 CPU ns/B for 64 KiB blocks). Used when the copies are
    large (``use``, per layer: layers may differ in size); small ones are cheaper in one
    ``index_select``."""

    MIN_SPAN_BYTES = 16384

    def __init__(self, paged: PagedKV, ids: torch.Tensor) -> None:
        self.slots = [int(s) for s in ids.tolist()]
        if self.slots and not 0 <= min(self.slots) <= max(self.slots) < paged.num_blocks:
            raise ValueError(f"block ids must be in [0, {paged.num_blocks}), got "
                             f"{min(self.slots)}..{max(self.slots)}")
        self.kv = paged.kv_layout == "kv_blocks"
        self.parts = paged.layer_parts  # (part, block stride, plane stride) per layer
        self.ptrs = [t.data_ptr() for t in paged.layer_bytes()]
        # Runs of consecutive slots are runs in every layer (a layer's stride is its part).
        spans = 2 * len(self.slots) if self.kv else len(_runs(self.slots, 1))
        host = paged.device.type == "cpu" and bool(self.slots)
        self.use = [host and len(self.slots) * part * (2 if self.kv else 1)
                    >= spans * self.MIN_SPAN_BYTES for part, _s, _p in self.parts]

    def copy(self, layer: int, first: int, count: int, dest: torch.Tensor) -> None:
        """Blocks ``first .. first + count`` of the segment, of ``layer``, into ``dest``
        (a contiguous host uint8 tensor of ``count`` blocks)."""
        part, stride, plane = self.parts[layer]
        if dest.device.type != "cpu" or not dest.is_contiguous() or \
                dest.numel() != count * part * (2 if self.kv else 1):
            raise ValueError(f"gather destination must be a contiguous host tensor of "
                             f"{count} blocks, got {dest.numel()} bytes on {dest.device}")
        base, out = self.ptrs[layer], dest.data_ptr()
        sl = self.slots[first:first + count]
        if self.kv:
            for j, s in enumerate(sl):
                at = base + s * stride
                memmove(out + 2 * j * part, at, part)
                memmove(out + (2 * j + 1) * part, at + plane, part)
            return
        i = 0
        while i < len(sl):
            k = i + 1
            while k < len(sl) and sl[k] == sl[k - 1] + 1:
                k += 1
            memmove(out + i * part, base + sl[i] * part, (k - i) * part)
            i = k


def _runs(slots: list[int], part: int) -> list[tuple[int, int]]:
    """``(byte offset, length)`` of each run of consecutive slots, in order."""
    spans: list[tuple[int, int]] = []
    for s in slots:
        at = s * part
        if spans and spans[-1][0] + spans[-1][1] == at:
            spans[-1] = (spans[-1][0], spans[-1][1] + part)
        else:
            spans.append((at, part))
    return spans


def write_file_header(fd: int, header: FileHeader) -> None:
    """Write a new session file's 4 KiB header at offset 0 (aligned, so O_DIRECT works)
    and make it durable."""
    raw = encode_file_header(header)
    buf = aligned_buffer(len(raw), pin=False)
    buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    pwrite_all(fd, writable_view(buf), 0)
    os.fdatasync(fd)


def _block_crcs(layout: SegmentLayout) -> list[BlockCrcs]:
    """One running block crc per layer of a segment being written (format version 4)."""
    return [BlockCrcs(b) for b in layout.layer_block_bytes]
