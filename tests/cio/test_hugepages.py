"""Huge pages for the node service's shared arena: what a mount gives (pure), which
mount holds a directory (``/proc/self/mountinfo``, escapes and nested mounts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.cio import hugepages
from flatcake.cio.hugepages import arena_pages, mount_of, shared_arena_pages


@pytest.mark.parametrize(("fs", "options", "shmem", "huge", "explicit", "says"), [
    ("hugetlbfs", "rw,pagesize=2M", "never", True, True, "explicit huge pages"),
    ("tmpfs", "rw,size=1g,huge=within_size", "never", True, False, "huge=within_size"),
    ("tmpfs", "rw,huge=advise", "advise", True, False, "huge=advise"),
    ("tmpfs", "rw,size=1g", "force", True, False, "forced"),
    ("tmpfs", "rw,huge=always", "deny", False, False, "shmem THP deny"),
    ("tmpfs", "rw,size=1g", "never", False, False, "tmpfs huge=never"),
    ("ext4", "rw", "always", False, False, "ext4 is not tmpfs or hugetlbfs"),
])
def test_what_a_mount_gives(fs: str, options: str, shmem: str, huge: bool, explicit: bool,
                            says: str) -> None:
    got = arena_pages(fs, options, shmem)
    assert (got.huge, got.explicit) == (huge, explicit)
    assert says in got.note
    assert got.note.startswith("4 KiB pages") != huge


def test_the_innermost_mount_holds_a_directory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "30 22 0:25 / /dev/shm rw shared:4 - tmpfs tmpfs rw,size=100k\n"
        "31 30 0:26 / /dev/shm/big\\040pages rw - hugetlbfs none rw,pagesize=2M\n"
        "32 22 0:27 / /dev/shm rw - tmpfs tmpfs rw,huge=within_size\n")
    monkeypatch.setattr(hugepages, "_MOUNTINFO", str(info))
    assert mount_of("/dev/shm/big pages/x") == ("hugetlbfs", "rw,pagesize=2M")
    assert mount_of("/dev/shm") == ("tmpfs", "rw,huge=within_size")  # mounted over
    assert mount_of("/dev/shmem") == ("ext4", "rw")
    monkeypatch.setattr(hugepages, "_MOUNTINFO", str(tmp_path / "missing"))
    assert mount_of("/dev/shm") == ("", "")
    assert shared_arena_pages("/dev/shm").note.startswith("4 KiB pages (unknown")
