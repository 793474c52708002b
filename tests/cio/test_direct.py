"""O_DIRECT plumbing: aligned buffers, probing, io_mode resolution, modes."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from flatcake.cio.direct import (
    DirectIOProbe,
    DirectIOUnsupported,
    aligned_buffer,
    ensure_dir,
    filesystem_type,
    open_file,
    probe_direct_io,
    pwrite_all,
    resolve_io_mode,
    writable_view,
)
from flatcake.cio.hugepages import HUGE_PAGE, huge_page_mode, huge_pages_note

SHM = Path("/dev/shm")


@pytest.mark.parametrize("num_bytes", [0, 1, 4095, 4096, 4097, 3 << 20])
def test_aligned_buffer(num_bytes: int) -> None:
    buf = aligned_buffer(num_bytes)
    assert buf.numel() == num_bytes and buf.dtype == torch.uint8
    assert buf.data_ptr() % 4096 == 0
    assert buf.is_pinned() == torch.cuda.is_available()
    with pytest.raises(ValueError, match="num_bytes"):
        aligned_buffer(-1)


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds ``address``."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split(None, 1)
            if not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if inside:
                    break
                inside = lo <= address < hi
            elif inside:
                fields[head[0][:-1]] = head[1].strip() if len(head) > 1 else ""
    return fields


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc/self/smaps")
def test_large_buffers_are_advised_huge_pages() -> None:
    buf = aligned_buffer(3 * HUGE_PAGE + 4096, pin=False)
    assert buf.numel() == 3 * HUGE_PAGE + 4096
    assert buf.data_ptr() % HUGE_PAGE == 0
    assert int(buf.sum()) == 0  # a fresh mapping: zeros, untouched by anyone else
    buf.fill_(5)
    assert int(buf[-1]) == 5 and int(buf[0]) == 5
    mapping = _mapping_of(buf.data_ptr())
    mode = huge_page_mode()
    assert mode in ("always", "madvise", "never", "unavailable")
    if mode != "unavailable":
        assert "hg" in mapping["VmFlags"].split()  # MADV_HUGEPAGE was applied
    assert ("transparent huge pages" in huge_pages_note()) == (mode in ("always", "madvise"))
    small = aligned_buffer(HUGE_PAGE - 4096, pin=False)  # below the size: heap memory
    assert "hg" not in _mapping_of(small.data_ptr()).get("VmFlags", "").split()


def test_probe_on_the_real_disk(tmp_path: Path) -> None:
    result = probe_direct_io(tmp_path)
    assert result.fs_type == filesystem_type(tmp_path) != "unknown"
    assert os.listdir(tmp_path) == []  # the probe file is gone
    if not result.supported:
        pytest.skip(f"{tmp_path} ({result.fs_type}) has no O_DIRECT: {result.reason}")
    assert resolve_io_mode(tmp_path, "direct") == "direct"
    fd = open_file(tmp_path / "f", "direct", create=True)
    try:
        buf = aligned_buffer(8192)
        buf.fill_(7)
        assert pwrite_all(fd, writable_view(buf), 4096) == 1
        # O_DIRECT really is on: an unaligned buffer is refused by the kernel.
        with pytest.raises(OSError):
            os.pwrite(fd, writable_view(aligned_buffer(8192))[1:4097], 0)
    finally:
        os.close(fd)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("io_mode", ["auto", "direct", "buffered"])
def test_tmpfs_each_io_mode(io_mode: str, caplog: pytest.LogCaptureFixture) -> None:
    # tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: either way the
    # outcome must follow the probe, and buffered I/O is never silent.
    supported = probe_direct_io(SHM).supported
    caplog.set_level(logging.WARNING, logger="flatcake.cio.direct")
    if io_mode == "direct" and not supported:
        with pytest.raises(DirectIOUnsupported, match=r"/dev/shm.*tmpfs"):
            resolve_io_mode(SHM, io_mode)
        return
    mode = resolve_io_mode(SHM, io_mode)
    expected = "buffered" if io_mode == "buffered" or not supported else "direct"
    assert mode == expected
    assert any("buffered" in r.getMessage() for r in caplog.records) == (expected == "buffered")


def _refusing_probe(directory: str) -> DirectIOProbe:
    return DirectIOProbe(directory, "fakefs", False, "EINVAL: Invalid argument")


def test_no_odirect_filesystem(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="flatcake.cio.direct")
    with pytest.raises(DirectIOUnsupported, match=f"{tmp_path}.*fakefs.*EINVAL"):
        resolve_io_mode(tmp_path, "direct", probe=_refusing_probe)
    assert caplog.records == []
    assert resolve_io_mode(tmp_path, "auto", probe=_refusing_probe) == "buffered"
    assert len(caplog.records) == 1
    assert "falling back to buffered" in caplog.records[0].getMessage()
    assert "fakefs" in caplog.records[0].getMessage()
    with pytest.raises(ValueError, match="io_mode"):
        resolve_io_mode(tmp_path, "fast")


def test_files_0600_and_dirs_0700(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        ensure_dir(tmp_path / "a" / "b")
        fd = open_file(tmp_path / "a" / "b" / "f", "buffered", create=True)
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "f").st_mode) == 0o600
    with pytest.raises(FileExistsError):
        open_file(tmp_path / "a" / "b" / "f", "buffered", create=True)


