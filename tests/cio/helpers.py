"""Builders shared by the restore tests of ``cio`` (staging window, zero-copy): a real
session file written with ``SegmentWriter``, a restore job planned for all of it, a
byte flip, a reader that logs the layer of every read, a hung disk, restores held
before they start, and a count of the reads that run at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from flatcake.cio.direct import open_file, resolve_io_mode
from flatcake.cio.format import FILE_HEADER_BYTES, FileHeader
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader, ReadRequest
from flatcake.cio.restore import OpenFile, RestoreJob
from flatcake.cio.writer import SegmentWriter, write_file_header
from flatcake.config import PlannerConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import HitRun, Segment
from flatcake.layout import SegmentLayout
from flatcake.plan.reads import plan_reads
from flatcake.plan.stream import StreamCheck
from flatcake.readplan import ReadPlan


@dataclass
class History:
    """A session file holding ``turns`` segments, and the source KV it came from."""

    path: str
    fd: int
    src: list[torch.Tensor]
    segments: list[Segment]
    crcs: list[tuple[int, ...]]
    bbpl: int

    @property
    def num_blocks(self) -> int:
        return sum(s.num_blocks for s in self.segments)


def write_history(tmp_path: Path, turns: list[int], num_layers: int = 3, bbpl: int = 300,
                  ) -> History:
    """One session file under ``tmp_path``: a segment of ``turns[i]`` random blocks per
    turn, ``num_layers`` layers of ``bbpl`` bytes per block; the caller closes ``fd``."""
    total = sum(turns)
    g = torch.Generator().manual_seed(len(turns) * 7 + bbpl)
    src = [torch.randint(0, 256, (total, bbpl), dtype=torch.uint8, generator=g)
           for _ in range(num_layers)]
    paged = PagedKV(src, bbpl)
    path = str(tmp_path / "0000000000000000.fcs")
    fd = open_file(path, resolve_io_mode(tmp_path, "auto"), create=True)
    os.posix_fallocate(fd, 0, 1 << 20)
    write_file_header(fd, FileHeader("s", 0, 0, 0, 1 << 20, (bbpl,) * num_layers))
    writer = SegmentWriter()
    offset, first = FILE_HEADER_BYTES, 0
    segments, crcs = [], []
    for seq, n in enumerate(turns):
        ids = torch.arange(first, first + n)
        keys = [i.to_bytes(32, "big") for i in range(first, first + n)]
        w = writer.write_ssd(fd, offset, paged, ids, keys, file_id=0, seq=seq,
                             turn_index=seq, first_block=first)
        layout = SegmentLayout.for_ssd(n, (bbpl,) * num_layers)
        segments.append(Segment(seq, "s", Medium.SSD, encode_address(Medium.SSD, 0, offset),
                                layout, tuple(keys), seq, 0, offset))
        crcs.append(w.header.layer_crcs)
        offset += w.total_bytes
        first += n
    return History(path, fd, src, segments, crcs, bbpl)


def restore_job(h: History, dst: list[torch.Tensor], cfg: PlannerConfig | None = None,
                slots: list[int] | None = None) -> RestoreJob:
    """A job restoring every block of ``h`` into ``dst`` (into ``slots``, default block
    ``i`` into slot ``i``), planned by the real planner, each segment checked by its crcs."""
    runs, checks, start = [], [], 0
    for seg, crcs in zip(h.segments, h.crcs, strict=True):
        runs.append(HitRun(seg, 0, seg.num_blocks, start))
        checks.append(StreamCheck(start, seg.num_blocks, crcs, start, seg.segment_id))
        start += seg.num_blocks
    plan = plan_reads(runs, len(h.src), cfg)
    slots = slots if slots is not None else list(range(h.num_blocks))
    return RestoreJob(plan, PagedKV(dst, h.bbpl), torch.tensor(slots), list(range(start)),
                      tuple(checks), {0: OpenFile(h.path, h.fd)}, None, start)


def flip_byte(path: str, at: int) -> None:
    """Damage one byte of a session file in place (a bit flip at ``at``)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))


class RecordingReader(DirectReader):
    """Logs the layer of every read as it is submitted."""

    def __init__(self, plan: ReadPlan, log: list[tuple[str, int]]) -> None:
        super().__init__(2)
        # The window submits each layer's ops in plan order, layer after layer.
        self._layers = iter([lp.layer for lp in plan.layers for _ in lp.ssd_ops])
        self._log = log

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        self._log.append(("read", next(self._layers)))
        return super().submit(request, dest)


def window_pages_held(path: Path, segments: Iterable[tuple[int, SegmentLayout]],
                      window: int) -> int:
    """Bytes of the whole pages inside the rows of the layers of ``window`` of each
    ``(file offset, layout)`` segment of the file ``path`` that hold data on disk
    (``SEEK_DATA``): what those layers alone allocate, released rows not."""
    from flatcake.cio.holes import is_hole
    from flatcake.control.windows import window_pages
    from flatcake.layout import ALIGN

    fd = os.open(path, os.O_RDONLY)
    try:
        return sum(0 if is_hole(fd, offset + page) else ALIGN
                   for offset, layout in segments for lo, hi in window_pages(layout, window)
                   for page in range(lo, hi, ALIGN))
    finally:
        os.close(fd)


class HungDisk:
    """Every read of the local SSD reader (``DirectReader``) hangs on its reader thread,
    as a ``preadv`` that does not return, until ``release``; then it reads. Release it
    in the test's teardown (``finally``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()  # a read is hanging
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self.late_reads = 0  # reads that ran once released
        real = DirectReader._read

        def hung(reader: DirectReader, request: ReadRequest,
                 views: list[memoryview]) -> int:
            self.entered.set()
            self._gate.wait(60)
            n = real(reader, request, views)
            with self._lock:
                self.late_reads += 1
            return n

        monkeypatch.setattr(DirectReader, "_read", hung)

    def release(self) -> None:
        self._gate.set()


class HeldRestores:
    """Every restore thread waits, before it takes a staging window and reads, until
    ``release`` (a loaded machine that runs it late); ``started`` is set once one
    waits. Release it in the test's teardown (``finally``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from flatcake.cio.loads import ExecutorLoads

        self.started = threading.Event()
        self._gate = threading.Event()
        real = ExecutorLoads._run_local

        def held(executor: ExecutorLoads, *args: Any) -> Any:
            self.started.set()
            self._gate.wait(60)
            return real(executor, *args)

        monkeypatch.setattr(ExecutorLoads, "_run_local", held)

    def release(self) -> None:
        self._gate.set()


class ReadOverlap:
    """Counts the reads of the local SSD reader (``DirectReader``) running at once. Each
    read waits (at most ``hold_s``) for a second one to start, so two reads handed to the
    reader together are always seen together."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_s: float = 0.1) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self.most_at_once = 0
        self.reads = 0
        real = DirectReader._read

        def counted(reader: DirectReader, request: ReadRequest,
                    views: list[memoryview]) -> int:
            with self._cond:
                self._inside += 1
                self.reads += 1
                self.most_at_once = max(self.most_at_once, self._inside)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._inside >= 2, hold_s)
            try:
                return real(reader, request, views)
            finally:
                with self._cond:
                    self._inside -= 1

        monkeypatch.setattr(DirectReader, "_read", counted)
