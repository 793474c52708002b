"""Device ceiling: whole files moved, command counts, fio optional."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.bench import device as dev

MIB = 1 << 20


def test_sequential_write_then_read_moves_the_whole_file(direct_dir: Path) -> None:
    path = str(direct_dir / "dev.bin")
    # 9 MiB asked in 2 MiB chunks: rounded up to 5 whole chunks.
    w = dev.write_sequential(path, 9 * MIB, chunk_bytes=2 * MIB, in_flight=3)
    assert (w.num_bytes, w.num_commands) == (10 * MIB, 5)
    assert Path(path).stat().st_size == 10 * MIB
    assert Path(path).stat().st_mode & 0o777 == 0o600
    r = dev.read_sequential(path, chunk_bytes=2 * MIB, in_flight=4)
    assert (r.num_bytes, r.num_commands) == (10 * MIB, 5)
    assert r.seconds > 0 and r.gbps > 0
    # Chunks are stamped with their index: no two are equal.
    data = Path(path).read_bytes()
    chunks = {data[i:i + 2 * MIB] for i in range(0, len(data), 2 * MIB)}
    assert len(chunks) == 5


def test_random_reads_count_commands(direct_dir: Path) -> None:
    path = str(direct_dir / "dev.bin")
    dev.write_sequential(path, 4 * MIB, chunk_bytes=MIB, in_flight=2)
    r = dev.read_random(path, op_bytes=65536, num_ops=100, in_flight=8)
    assert (r.num_bytes, r.num_commands) == (100 * 65536, 100)
    assert r.iops > 0


def test_bad_sizes_are_rejected(direct_dir: Path) -> None:
    path = str(direct_dir / "dev.bin")
    with pytest.raises(ValueError, match="chunk_bytes"):
        dev.write_sequential(path, MIB, chunk_bytes=1000)
    dev.write_sequential(path, MIB, chunk_bytes=MIB, in_flight=1)
    with pytest.raises(ValueError, match="op_bytes"):
        dev.read_random(path, op_bytes=100, num_ops=1)
    with pytest.raises(ValueError, match="less than one"):
        dev.read_sequential(path, chunk_bytes=2 * MIB)
    with pytest.raises(ValueError, match="rw"):
        dev.run_fio(path, rw="trim", block_bytes=4096)


def test_fio_absent_gives_none(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev.shutil, "which", lambda name: None)
    assert not dev.fio_available()
    path = str(direct_dir / "dev.bin")
    dev.write_sequential(path, MIB, chunk_bytes=MIB, in_flight=1)
    assert dev.run_fio(path, rw="read", block_bytes=MIB) is None


@pytest.mark.skipif(not dev.fio_available(), reason="fio is not installed")
def test_fio_reads_the_same_file(direct_dir: Path) -> None:
    path = str(direct_dir / "dev.bin")
    dev.write_sequential(path, 8 * MIB, chunk_bytes=MIB, in_flight=2)
    res = dev.run_fio(path, rw="read", block_bytes=MIB, iodepth=4)
    assert res is not None
    assert (res.rw, res.block_bytes, res.iodepth) == ("read", MIB, 4)
    assert res.gbps > 0 and res.iops > 0
