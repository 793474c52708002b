"""Readers: O_DIRECT preadv from a thread pool; kvikio/GDS when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from flatcake.cio.direct import aligned_buffer, open_file, resolve_io_mode
from flatcake.cio.readers import DirectReader, GdsReader, ReadRequest, kvikio_available


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
