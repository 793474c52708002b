"""The node service's shared arena and huge pages: ``flatcake serve --status`` and its log
at start say how the arena is backed (huge pages where the kernel gives them, else 4 KiB
pages and why); an arena hugetlbfs cannot hold is refused at start with a clear message,
the socket and the root's lock given back."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flatcake.cio.hugepages import ArenaPages, shared_arena_pages
from flatcake.config import load_config
from flatcake.service import server
from tests.service.helpers import Service


def test_status_says_how_the_arena_is_backed(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    try:
        out = subprocess.run([sys.executable, "-m", "flatcake.cli", "serve", "--status",
                              "--socket", str(svc.sock)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        status = json.loads(out.stdout)
        expected = shared_arena_pages(str(svc.arena_dir))
        assert status["arena_pages"] == expected.note
        assert status["arena_huge_pages"] is expected.huge
        # The arena exists from the start, before any engine attached.
        (arena,) = list(svc.arena_dir.iterdir())
        assert os.stat(arena).st_size == 1048576  # helpers.BASE's memory capacity
    finally:
        assert svc.stop() == 0, svc.stderr()


def test_the_arena_note_is_logged_at_start_at_the_default_verbosity(tmp_path: Path) -> None:
    """The docs promise one line at start saying how the arena is backed (and how to get
    huge pages): `flatcake serve` without -v logs it."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    try:
        note = shared_arena_pages(str(svc.arena_dir)).note
        logged = svc.stderr()  # the service's stderr, written before "ready:"
        assert f"INFO flatcake.service: shared arena in {svc.arena_dir}: {note}" in logged
    finally:
        assert svc.stop() == 0, svc.stderr()


def test_an_arena_hugetlbfs_cannot_hold_is_refused_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "shared_arena_pages",
                        lambda _dir: ArenaPages(True, True, "explicit huge pages (hugetlbfs)"))

    def no_pages(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_pages)
    (tmp_path / "huge").mkdir()
    cfg = load_config(env={}, overrides=[f"store.node_arena_dir={tmp_path / 'huge'}",
                                         "store.memory_capacity_bytes=3000000"])
    sock = tmp_path / "node.sock"
    with pytest.raises(ValueError, match=r"cannot reserve \d+ B of huge pages for the arena"):
        server.NodeService(tmp_path / "root", cfg, sock)
    assert not sock.exists()
    # Sized in whole huge pages (this directory's block size stands for hugetlbfs's).
    (arena,) = list((tmp_path / "huge").iterdir())
    page = os.statvfs(tmp_path / "huge").f_bsize
    assert os.stat(arena).st_size == -(-3000000 // page) * page
    monkeypatch.undo()
    again = server.NodeService(tmp_path / "root", cfg, sock)  # the root's lock was let go
    again.close()


def test_an_arena_its_mount_cannot_hold_is_warned_of_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real = os.statvfs

    def small(path: object) -> os.statvfs_result:
        got = real(path)  # type: ignore[arg-type]
        return os.statvfs_result((got.f_bsize, 4096, got.f_blocks, 10, 10, *got[5:]))

    monkeypatch.setattr(os, "statvfs", small)
    (tmp_path / "shm").mkdir()
    cfg = load_config(env={}, overrides=[f"store.node_arena_dir={tmp_path / 'shm'}",
                                         "store.memory_capacity_bytes=1048576"])
    with caplog.at_level("WARNING", logger="flatcake.service"):
        svc = server.NodeService(tmp_path / "root", cfg, tmp_path / "node.sock")
        svc.close()
    (warned,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "has 40960 B free, the arena needs 1048576 B more" in warned and "SIGBUS" in warned
