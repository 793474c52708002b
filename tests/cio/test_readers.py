"""Readers: O_DIRECT preadv from a thread pool; kvikio/GDS when present; the per-restore
queue that bounds the commands in flight."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from flatcake.cio.direct import aligned_buffer, open_file, resolve_io_mode
from flatcake.cio.readers import (
    DirectReader,
    GdsReader,
    ReaderStats,
    ReadQueue,
    ReadRequest,
    kvikio_available,
)


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[str, bytes]:
    data = os.urandom(1 << 20)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return str(path), data


def test_many_reads_in_flight_land_where_asked(data_file: tuple[str, bytes]) -> None:
    path, data = data_file
    mode = resolve_io_mode(os.path.dirname(path), "auto")
    fd = open_file(path, mode, writable=False)
    reader = DirectReader(num_threads=4)
    try:
        dest = aligned_buffer(1 << 20)
        # 16 reads of 64 KiB in reverse file order, each into the mirrored place.
        ranges = [(i * 65536, (15 - i) * 65536) for i in range(16)]
        futures = [reader.submit(ReadRequest(path, fd, fo, 65536, do), dest)
                   for fo, do in ranges]
        assert [f.result() for f in futures] == [65536] * 16
        got = dest.numpy().tobytes()
        for fo, do in ranges:
            assert got[do:do + 65536] == data[fo:fo + 65536]
        stats = reader.stats()
        assert (stats.commands, stats.bytes_read) == (16, 1 << 20)
    finally:
        reader.close()
        os.close(fd)


def test_read_past_end_of_file_raises(data_file: tuple[str, bytes]) -> None:
    path, _ = data_file
    fd = open_file(path, "buffered", writable=False)
    reader = DirectReader(num_threads=1)
    try:
        dest = aligned_buffer(8192)
        fut = reader.submit(ReadRequest(path, fd, (1 << 20) - 4096, 8192, 0), dest)
        with pytest.raises(OSError, match="short read"):
            fut.result()
    finally:
        reader.close()
        os.close(fd)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"file_offset": 100}, "file_offset"), ({"length": 4000}, "length"),
     ({"dest_offset": 1}, "dest_offset"), ({"length": 0}, "length")],
)
def test_unaligned_requests_rejected(kwargs: dict[str, int], field: str) -> None:
    args = {"path": "x", "fd": 0, "file_offset": 0, "length": 4096, "dest_offset": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        ReadRequest(**args)  # type: ignore[arg-type]


def test_bad_destinations_rejected(data_file: tuple[str, bytes]) -> None:
    path, _ = data_file
    reader = DirectReader(num_threads=1)
    try:
        req = ReadRequest(path, 0, 0, 8192, 0)
        with pytest.raises(ValueError, match="exceeds"):
            reader.submit(req, aligned_buffer(4096))
        with pytest.raises(ValueError, match="aligned"):
            reader.submit(req, aligned_buffer(3 * 4096)[1:8193])
        with pytest.raises(ValueError, match="uint8"):
            reader.submit(req, torch.empty(8192, dtype=torch.float32))
    finally:
        reader.close()
    with pytest.raises(ValueError, match="read_threads"):
        DirectReader(num_threads=0)


@pytest.mark.gpu
@pytest.mark.skipif(not kvikio_available(), reason="needs CUDA and kvikio")
def test_gds_reader_reads_into_gpu(data_file: tuple[str, bytes]) -> None:
    path, data = data_file
    reader = GdsReader(num_threads=2)
    try:
        dest = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        futs = [reader.submit(ReadRequest(path, -1, i << 18, 1 << 18, (3 - i) << 18), dest)
                for i in range(4)]
        assert sum(f.result() for f in futs) == 1 << 20
        got = dest.cpu().numpy().tobytes()
        for i in range(4):
            assert got[(3 - i) << 18:(4 - i) << 18] == data[i << 18:(i + 1) << 18]
    finally:
        reader.close()


def test_gds_reader_refuses_without_kvikio() -> None:
    if kvikio_available():
        pytest.skip("kvikio present")
    with pytest.raises(RuntimeError, match="kvikio"):
        GdsReader(num_threads=1)


class SlowDirectReader(DirectReader):
    """A real ``DirectReader`` whose every ``preadv`` command takes >= 20 ms, counting
    how many run at once (the kernel's view of "in flight")."""

    def __init__(self, num_threads: int) -> None:
        super().__init__(num_threads)
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def _read(self, request: ReadRequest, view: memoryview) -> int:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(0.02)
            return super()._read(request, view)
        finally:
            with self._lock:
                self.active -= 1


@pytest.mark.parametrize("limit", [1, 3, None])
def test_read_queue_bounds_the_commands_in_flight(data_file: tuple[str, bytes],
                                                  limit: int | None) -> None:
    path, data = data_file
    fd = open_file(path, resolve_io_mode(os.path.dirname(path), "auto"), writable=False)
    reader = SlowDirectReader(num_threads=8)
    try:
        queue = ReadQueue(reader, limit)
        dest = aligned_buffer(1 << 20)
        ranges = [(i * 65536, (15 - i) * 65536) for i in range(16)]
        futures = [queue.submit(ReadRequest(path, fd, fo, 65536, do), dest)
                   for fo, do in ranges]
        assert [f.result(timeout=10) for f in futures] == [65536] * 16
        got = dest.numpy().tobytes()
        for fo, do in ranges:
            assert got[do:do + 65536] == data[fo:fo + 65536]
    finally:
        reader.close()
        os.close(fd)
    # Never more than the limit at once, and the limit is reached (16 slow reads); with
    # no limit, the reader's 8 threads are the only bound.
    if limit is None:
        assert 3 < reader.peak <= 8 and queue.peak_in_flight >= reader.peak
    else:
        assert reader.peak == queue.peak_in_flight == limit
    assert reader.stats().commands == 16


class InstantReader:
    """Completes every read before ``submit`` returns (no I/O), logging the order."""

    name = "instant"
    device_type = "cpu"

    def __init__(self, fail_at: int = -1) -> None:
        self.order: list[int] = []
        self.fail_at = fail_at

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        fut: Future[int] = Future()
        self.order.append(request.file_offset // 4096)
        if len(self.order) - 1 == self.fail_at:
            fut.set_exception(OSError(5, "Input/output error"))
        else:
            fut.set_result(request.length)
        return fut

    def stats(self) -> ReaderStats:
        return ReaderStats(len(self.order), 0)

    def close(self) -> None:
        pass


def test_read_queue_keeps_order_and_never_recurses() -> None:
    # A reader that completes synchronously hands the next request over from inside
    # the completion: thousands of them must neither recurse nor reorder.
    reader = InstantReader(fail_at=7)
    queue = ReadQueue(reader, 1)
    dest = aligned_buffer(4096)
    futures = [queue.submit(ReadRequest("x", 0, i * 4096, 4096, 0), dest)
               for i in range(5000)]
    assert reader.order == list(range(5000))
    with pytest.raises(OSError, match="Input/output"):
        futures[7].result()  # a failed read fails its own future only
    assert all(f.result() == 4096 for i, f in enumerate(futures) if i != 7)
    assert queue.peak_in_flight == 1


def test_read_queue_rejects_bad_input_at_submit() -> None:
    with pytest.raises(ValueError, match="reads_in_flight"):
        ReadQueue(InstantReader(), 0)
    queue = ReadQueue(InstantReader(), 2)
    with pytest.raises(ValueError, match="exceeds"):
        queue.submit(ReadRequest("x", 0, 0, 8192, 0), aligned_buffer(4096))


class HeldReader(InstantReader):
    """Holds every read until the test completes it."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Future[int]] = []

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        fut: Future[int] = Future()
        self.order.append(request.file_offset // 4096)
        self.held.append(fut)
        return fut


def test_abandon_fails_waiting_reads_and_waits_for_started_ones() -> None:
    reader = HeldReader()
    queue = ReadQueue(reader, 2)
    dest = aligned_buffer(4096)
    futures = [queue.submit(ReadRequest("x", 0, i * 4096, 4096, 0), dest) for i in range(5)]
    assert reader.order == [0, 1]  # the other three wait in the queue
    done = threading.Event()
    quitter = threading.Thread(target=lambda: (queue.abandon(), done.set()))
    quitter.start()
    for f in futures[2:]:
        with pytest.raises(RuntimeError, match="abandoned"):
            f.result(timeout=5)
    assert not done.wait(0.1)  # two reads still write into the buffer
    reader.held[0].set_result(4096)
    assert not done.wait(0.05)
    reader.held[1].set_result(4096)
    assert done.wait(5)
    quitter.join(5)
    assert reader.order == [0, 1] and [f.result() for f in futures[:2]] == [4096, 4096]


def test_read_queue_with_room_hands_back_the_readers_own_future() -> None:
    # One future per command, not two: with room and nothing waiting, the caller gets
    # the reader's future; the queue still counts it and hands waiting reads over.
    reader = HeldReader()
    queue = ReadQueue(reader, 1)
    dest = aligned_buffer(4096)
    first = queue.submit(ReadRequest("x", 0, 0, 4096, 0), dest)
    second = queue.submit(ReadRequest("x", 0, 4096, 4096, 0), dest)
    assert first is reader.held[0]
    assert second is not reader.held[0] and len(reader.held) == 1  # waits for room
    reader.held[0].set_result(4096)
    assert reader.order == [0, 1] and first.result() == 4096
    reader.held[1].set_exception(OSError(5, "Input/output error"))
    with pytest.raises(OSError, match="Input/output"):
        second.result()
    third = queue.submit(ReadRequest("x", 0, 8192, 4096, 0), dest)
    assert third is reader.held[2] and queue.peak_in_flight == 1
