"""Restore programs: what a layout reads, pass by pass, and where each block lands.

Every baseline layout in the bench is reduced to a ``RestoreProgram``: a sequence of
passes, each filling one staging buffer with direct reads and then scattering the
staged blocks into the engine's paged KV. ``run_program`` executes it with the *same*
reader FlatCake restores through (``cio.readers.DirectReader``) and the same scatter
(``cio.paged.PagedKV.scatter``), double-buffered: the reads of pass ``p + 1`` are in
flight while pass ``p`` is scattered, just as FlatCake's two-layer staging window does.
So the layouts differ only in the commands they need, never in the machinery.

Staging buffer of one pass (``stage_stride_bytes`` >= ``block_bytes_per_layer`` when a
layout pads blocks to 4 KiB)::

    dest_offset 0                                        staging_bytes
    +-----------+-----------+-----   ...   -----+-----------+
    | run 0: block 0 .. n0-1 of layer l0 (stride)| run 1 ... |
    +-----------+-----------+-----   ...   -----+-----------+
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader, ReadRequest


@dataclass(frozen=True, slots=True)
class FileRead:
    """One read command of a pass.

    Attributes:
        path: file to read.
        file_offset: first byte in the file (multiple of 4096).
        length: bytes (multiple of 4096).
        dest_offset: where the bytes land in the pass's staging buffer (multiple of 4096).
    """

    path: str
    file_offset: int
    length: int
    dest_offset: int


@dataclass(frozen=True, slots=True)
class ScatterRun:
    """Consecutive request blocks ``[first_block, first_block + num_blocks)`` of one layer,
    staged at ``dest_offset`` with ``stride_bytes`` between blocks."""

    layer: int
    first_block: int
    num_blocks: int
    dest_offset: int
    stride_bytes: int


@dataclass(frozen=True, slots=True)
class ReadPass:
    """Reads that fill one staging buffer, then the runs scattered out of it."""

    reads: tuple[FileRead, ...]
    runs: tuple[ScatterRun, ...]
    staging_bytes: int


@dataclass(frozen=True, slots=True)
class RestoreProgram:
    """A layout's whole restore of one request.

    Attributes:
        layout: layout name as the bench reports it.
        passes: in execution order.
        open_per_pass: open the pass's files inside the timed region (a file-per-chunk
            store opens each chunk's file when it reads it) instead of once up front.
        files_bytes: bytes the layout keeps on disk for this experiment (all sessions).
    """

    layout: str
    passes: tuple[ReadPass, ...]
    open_per_pass: bool = False
    files_bytes: int = 0

    @property
    def num_commands(self) -> int:
        return sum(len(p.reads) for p in self.passes)

    @property
    def bytes_read(self) -> int:
        return sum(r.length for p in self.passes for r in p.reads)

    @property
    def max_staging_bytes(self) -> int:
        return max((p.staging_bytes for p in self.passes), default=0)

    def paths(self) -> list[str]:
        return sorted({r.path for p in self.passes for r in p.reads})


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """Timing and counters of one ``run_program``.

    Attributes:
        seconds: wall time of the restore (reads, waits, scatters).
        read_commands: commands the reader issued during the restore.
        bytes_read: bytes the reader returned during the restore.
    """

    seconds: float
    read_commands: int
    bytes_read: int


def _open_direct(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)


def run_program(program: RestoreProgram, reader: DirectReader, paged: PagedKV,
                block_table: torch.Tensor) -> ProgramRun:
    """Execute ``program`` into ``paged``; request block ``i`` lands in slot
    ``block_table[i]``. Two staging buffers alternate between passes."""
    if not program.passes:
        return ProgramRun(0.0, 0, 0)
    size = program.max_staging_bytes
    buffers = [aligned_buffer(size), aligned_buffer(size)]
    for buf in buffers:
        buf.fill_(0)  # fault the pages in before the clock starts
    fds: dict[str, int] = {}
    if not program.open_per_pass:
        fds = {path: _open_direct(path) for path in program.paths()}
    before = reader.stats()
    pass_fds: list[list[int]] = [[], []]

    def submit(index: int) -> list[Future[int]]:
        ops = program.passes[index]
        dest = buffers[index % 2]
        futures = []
        for r in ops.reads:
            fd = fds.get(r.path)
            if fd is None:
                fd = _open_direct(r.path)
                pass_fds[index % 2].append(fd)
            req = ReadRequest(path=r.path, fd=fd, file_offset=r.file_offset, length=r.length,
                              dest_offset=r.dest_offset)
            futures.append(reader.submit(req, dest))
        return futures

    def scatter(index: int) -> None:
        dest = buffers[index % 2]
        for run in program.passes[index].runs:
            end = run.dest_offset + run.num_blocks * run.stride_bytes
            staged = dest[run.dest_offset:end]
            bbl = paged.layer_block_bytes[run.layer]
            if run.stride_bytes != bbl:
                staged = staged.view(run.num_blocks, run.stride_bytes)[:, :bbl].reshape(-1)
            ids = block_table[run.first_block:run.first_block + run.num_blocks]
            paged.scatter(run.layer, ids, staged)

    try:
        t0 = time.perf_counter()
        pending = submit(0)
        for index in range(len(program.passes)):
            nxt = submit(index + 1) if index + 1 < len(program.passes) else []
            for fut in pending:
                fut.result()
            for fd in pass_fds[index % 2]:
                os.close(fd)
            pass_fds[index % 2].clear()
            scatter(index)
            pending = nxt
        seconds = time.perf_counter() - t0
    finally:
        for fd in fds.values():
            os.close(fd)
        for group in pass_fds:
            for fd in group:
                os.close(fd)
    after = reader.stats()
    return ProgramRun(seconds, after.commands - before.commands,
                      after.bytes_read - before.bytes_read)


def verify_restore(paged_views: Sequence[torch.Tensor], source: Sequence[torch.Tensor],
                   block_table: torch.Tensor, layer_window_blocks: tuple[int, ...] = ()
                   ) -> int:
    """Compare restored slots with the source, layer by layer; return how many (block,
    layer) pairs differ (0 when the restore is exact). A sliding-window layer (its
    window in ``layer_window_blocks``) is compared on the request's last window only:
    the blocks a next turn reads.

    ``paged_views[l]``: ``(num_slots, block_bytes_per_layer)`` uint8 view of the engine's
    layer ``l``; ``source[l]``: ``(num_blocks, block_bytes_per_layer)`` bytes written.
    """
    bad = 0
    for layer, src in enumerate(source):
        window = layer_window_blocks[layer] if layer_window_blocks else 0
        table = block_table[-window:] if window else block_table
        got = _as_words(paged_views[layer]).index_select(0, table)
        want = _as_words(src[-window:] if window else src)
        if not torch.equal(got, want):
            bad += int((got != want).any(dim=1).sum())
    return bad


def _as_words(rows: torch.Tensor) -> torch.Tensor:
    """Rows of bytes as rows of int64 when they divide evenly: torch's index kernels copy
    per element, so 8-byte elements compare and gather several times faster."""
    return rows.view(torch.int64) if rows.shape[-1] % 8 == 0 else rows
