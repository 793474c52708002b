"""Staging window: double-buffered layer pipeline, per-layer ready signals, crc checks.

Scenarios build real session files with ``SegmentWriter``, plan them with the real
planner, and restore them through ``StagingWindow`` into a paged KV tensor.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader, ReaderStats, ReadRequest
from flatcake.cio.restore import LayerReady, RestoreOutcome
from flatcake.cio.staging import StagingWindow
from flatcake.config import PlannerConfig
from tests.cio.helpers import History, RecordingReader, flip_byte, restore_job, write_history


@pytest.fixture
def history(tmp_path: Path):  # type: ignore[no-untyped-def]
    h = write_history(tmp_path, [5, 1, 9, 4])
    yield h
    os.close(h.fd)


@pytest.mark.parametrize("crc_threads", [1, 3])
def test_restore_is_byte_exact_even_when_reads_split_inside_blocks(history: History,
                                                                   crc_threads: int) -> None:
    # 4 KiB reads of 300-byte blocks: most blocks straddle two reads.
    n = history.num_blocks
    dst = [torch.zeros(n + 5, history.bbpl, dtype=torch.uint8) for _ in history.src]
    slots = list(range(n + 4, 4, -1))  # reversed, offset slots
    job = restore_job(history, dst, PlannerConfig(gap_limit_bytes=0, max_read_bytes=4096), slots)
    reader = DirectReader(3)
    # Checksums in 1000-byte chunks on three threads, combined: same verdict.
    window = StagingWindow(reader, crc_threads=crc_threads, crc_chunk_bytes=1000)
    try:
        outcome = window.run(job, LayerReady(len(dst)))
    finally:
        window.close()
        reader.close()
    assert outcome.num_blocks_loaded == n and outcome.failed_tags == ()
    assert outcome.commands == job.plan.num_commands == reader.stats().commands
    for layer in range(len(dst)):
        assert torch.equal(dst[layer][slots], history.src[layer])
        assert not dst[layer][:5].any()


class RecordingPaged(PagedKV):
    def __init__(self, inner: PagedKV, log: list[tuple[str, int]]) -> None:
        self.__dict__.update(inner.__dict__)
        self._log = log

    def scatter(self, layer: int, ids: torch.Tensor, src: torch.Tensor) -> None:
        self._log.append(("scatter", layer))
        super().scatter(layer, ids, src)


def test_layer_l_plus_1_is_read_before_layer_l_is_scattered(history: History) -> None:
    dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
           for _ in history.src]
    job = restore_job(history, dst)
    log: list[tuple[str, int]] = []
    job.paged = RecordingPaged(job.paged, log)
    reader = RecordingReader(job.plan, log)
    try:
        StagingWindow(reader).run(job, LayerReady(len(dst)))
    finally:
        reader.close()
    num_layers = len(dst)
    for layer in range(num_layers):
        first_scatter = log.index(("scatter", layer))
        if layer + 1 < num_layers:
            assert log.index(("read", layer + 1)) < first_scatter
        if layer + 2 < num_layers:  # only two slots: l+2 waits until l is scattered
            assert log.index(("read", layer + 2)) > first_scatter


class GatedReader:
    """Holds every read until the test releases it (a slow SSD the test controls)."""

    name = "gated"
    device_type = "cpu"

    def __init__(self) -> None:
        self._inner = DirectReader(1)
        self._cv = threading.Condition()
        self._pending: list[tuple[ReadRequest, torch.Tensor, Future[int]]] = []
        self.peak_pending = 0

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        fut: Future[int] = Future()
        with self._cv:
            self._pending.append((request, dest, fut))
            self.peak_pending = max(self.peak_pending, len(self._pending))
            self._cv.notify_all()
        return fut

    def wait_pending(self, count: int, timeout: float = 5) -> bool:
        """Wait until exactly ``count`` reads are held."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self._pending) == count, timeout)

    @property
    def num_pending(self) -> int:
        with self._cv:
            return len(self._pending)

    def release(self, count: int) -> None:
        for _ in range(count):
            with self._cv:
                self._cv.wait_for(lambda: bool(self._pending), timeout=5)
                request, dest, fut = self._pending.pop(0)
            fut.set_result(self._inner.submit(request, dest).result())

    def stats(self) -> ReaderStats:
        return self._inner.stats()

    def close(self) -> None:
        self._inner.close()


def test_each_layer_is_signalled_as_soon_as_it_lands(history: History) -> None:
    dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
           for _ in history.src]
    job = restore_job(history, dst)
    per_layer = [len(lp.ssd_ops) for lp in job.plan.layers]
    reader = GatedReader()
    ready = LayerReady(len(dst))
    runner = threading.Thread(target=StagingWindow(reader).run, args=(job, ready))
    runner.start()
    try:
        reader.release(per_layer[0])
        assert ready.wait_for_layer(0, timeout=5)
        # Layer 0 is in place, byte for byte, while layer 1 is still on "disk".
        assert torch.equal(dst[0], history.src[0])
        assert not ready.wait_for_layer(1, timeout=0.05)
        assert not dst[1].any()
        reader.release(per_layer[1])
        assert ready.wait_for_layer(1, timeout=5)
        assert not ready.wait_for_layer(2, timeout=0.05)
        reader.release(sum(per_layer[2:]))
        assert ready.wait_for_layer(2, timeout=5)
    finally:
        reader.release(0)
        runner.join(timeout=10)
        reader.close()
    assert all(torch.equal(d, s) for d, s in zip(dst, history.src, strict=True))
    with pytest.raises(ValueError, match="layer"):
        ready.wait_for_layer(len(dst))


@pytest.mark.parametrize("limit", [1, 3, None])
def test_reads_in_flight_bounds_the_commands_of_a_restore(history: History,
                                                         limit: int | None) -> None:
    # 4 KiB reads: every layer is many commands, so the bound is what holds them back.
    dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
           for _ in history.src]
    job = restore_job(history, dst, PlannerConfig(gap_limit_bytes=0, max_read_bytes=4096))
    per_layer = [len(lp.ssd_ops) for lp in job.plan.layers]
    assert min(per_layer) > 3
    reader = GatedReader()
    window = StagingWindow(reader, reads_in_flight=limit)
    outcomes: list[RestoreOutcome] = []
    runner = threading.Thread(
        target=lambda: outcomes.append(window.run(job, LayerReady(len(dst)))))
    runner.start()
    # Nothing has completed: the window has planned layers 0 and 1, and hands the
    # reader only ``limit`` commands of them (all of them without a limit).
    expected = per_layer[0] + per_layer[1] if limit is None else limit
    try:
        assert reader.wait_pending(expected)
        time.sleep(0.05)
        assert reader.num_pending == expected
        reader.release(sum(per_layer))  # one at a time, each making room for the next
    finally:
        runner.join(timeout=10)
        reader.close()
    (outcome,) = outcomes
    if limit is None:  # later, layer l+2's reads may join layer l+1's: at least that
        assert outcome.peak_reads_in_flight >= reader.peak_pending >= expected
    else:
        assert reader.peak_pending == outcome.peak_reads_in_flight == limit
    assert outcome.num_blocks_loaded == history.num_blocks
    assert outcome.commands == sum(per_layer)
    assert all(torch.equal(d, s) for d, s in zip(dst, history.src, strict=True))


def test_reads_in_flight_is_validated() -> None:
    reader = DirectReader(1)
    try:
        with pytest.raises(ValueError, match="reads_in_flight"):
            StagingWindow(reader, reads_in_flight=0)
    finally:
        reader.close()


@pytest.mark.parametrize(("flip_layer", "crc_threads"), [(0, 1), (2, 1), (2, 3)])
def test_crc_failure_cuts_the_restore_at_the_damaged_segment(history: History,
                                                             flip_layer: int,
                                                             crc_threads: int) -> None:
    seg = history.segments[2]  # request blocks [6, 15)
    at = seg.file_offset + seg.layout.block_offset(flip_layer, 4)  # type: ignore[operator]
    flip_byte(history.path, at)
    dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
           for _ in history.src]
    reader = DirectReader(2)
    window = StagingWindow(reader, crc_threads=crc_threads, crc_chunk_bytes=1000)
    try:
        outcome = window.run(restore_job(history, dst), LayerReady(len(dst)))
    finally:
        window.close()
        reader.close()
    assert outcome.num_blocks_loaded == 6
    assert outcome.failed_tags == (2,)
    for layer in range(len(dst)):
        assert torch.equal(dst[layer][:6], history.src[layer][:6])
        if layer >= flip_layer:  # damaged bytes are never scattered
            assert not dst[layer][6:15].any()


class FailingOnceReader(DirectReader):
    """Its first command fails with EIO (the window then reads it again in parts)."""

    def __init__(self) -> None:
        super().__init__(2)
        self._failed = False

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        if self._failed:
            return super().submit(request, dest)
        self._failed = True
        out: Future[int] = Future()
        out.set_exception(OSError(5, "injected EIO"))
        return out


@pytest.mark.parametrize(("max_read_bytes", "flip", "fail_once"), [
    (None, False, False), (4096, False, False), (None, True, False), (None, False, True)])
def test_checksums_run_on_the_reader_threads(history: History,
                                             monkeypatch: pytest.MonkeyPatch,
                                             max_read_bytes: int | None, flip: bool,
                                             fail_once: bool) -> None:
    import flatcake.cio.crc as crc
    import flatcake.cio.staging as staging

    calls: list[tuple[str, int]] = []  # (thread name, bytes) of every data crc
    real = staging.crc32

    def recording_crc32(data: memoryview, value: int = 0) -> int:
        calls.append((threading.current_thread().name, len(data)))
        return real(data, value)

    real_views = crc.crc_views

    def recording_crc_views(views: list[memoryview]) -> int:
        calls.extend((threading.current_thread().name, len(v)) for v in views)
        return real_views(views)

    monkeypatch.setattr(staging, "crc32", recording_crc32)  # checks left to this thread
    monkeypatch.setattr(crc, "crc_views", recording_crc_views)  # on the reader threads
    if flip:
        seg = history.segments[2]  # request blocks [6, 15)
        at = seg.file_offset + seg.layout.block_offset(1, 4)  # type: ignore[operator]
        flip_byte(history.path, at)
    dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
           for _ in history.src]
    cfg = PlannerConfig(max_read_bytes=max_read_bytes) if max_read_bytes else None
    job = restore_job(history, dst, cfg)
    reader = FailingOnceReader() if fail_once else DirectReader(2)
    window = StagingWindow(reader)
    try:
        outcome = window.run(job, LayerReady(len(dst)))
    finally:
        window.close()
        reader.close()
    loaded = 6 if flip else history.num_blocks
    assert outcome.num_blocks_loaded == loaded
    assert outcome.failed_tags == ((2,) if flip else ())
    for layer in range(len(dst)):
        assert torch.equal(dst[layer][:loaded], history.src[layer][:loaded])
    here = [n for name, n in calls if not name.startswith("flatcake-read")]
    there = [n for name, n in calls if name.startswith("flatcake-read")]
    assert there  # the reader threads checked what they read
    # Every segment-layer byte was checked exactly once. This thread checks a command
    # that failed and was read again in parts, and one that completed before its
    # callback was attached (tiny reads here; a real read takes longer than that).
    checked = sum(there) + sum(here)
    assert checked == history.num_blocks * history.bbpl * len(dst)
    if fail_once:
        assert here


def test_a_window_makes_each_slots_byte_view_once(history: History,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The staging slots outlive restores: their byte views are made once, not per layer.
    import flatcake.cio.staging as staging

    made: list[int] = []
    real = staging.writable_view

    def counting_view(buf: torch.Tensor) -> memoryview:
        made.append(buf.data_ptr())
        return real(buf)

    monkeypatch.setattr(staging, "writable_view", counting_view)
    reader = DirectReader(2)
    window = StagingWindow(reader)
    try:
        for _ in range(2):
            dst = [torch.zeros(history.num_blocks, history.bbpl, dtype=torch.uint8)
                   for _ in history.src]
            outcome = window.run(restore_job(history, dst), LayerReady(len(dst)))
            assert outcome.num_blocks_loaded == history.num_blocks
            for layer in range(len(dst)):
                assert torch.equal(dst[layer], history.src[layer])
    finally:
        window.close()
        reader.close()
    assert len(history.src) > 2 and 1 <= len(made) <= 2 and len(set(made)) == len(made)
