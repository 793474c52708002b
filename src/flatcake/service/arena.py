"""The node service's files per tensor-parallel part: each part's store directory and
its shared arena file (kept across service restarts, sized and reserved on hugetlbfs)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from flatcake.cio.hugepages import ArenaPages
from flatcake.config import FlatCakeConfig
from flatcake.link import trust

logger = logging.getLogger("flatcake.service")


def rank_dir(root: Path, part: int, parts: int) -> Path:
    """The store directory of a block's tensor-parallel part ``part`` of ``parts`` (the
    root itself for one part)."""
    return root if parts == 1 else root / f"tp{part}"


def arena_path(root: Path, config: FlatCakeConfig, rank: int) -> Path:
    """The shared arena file of ``rank`` for ``root``, in ``store.node_arena_dir``."""
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
    return Path(config.store.node_arena_dir) / f"flatcake-{os.getuid()}-{digest}-tp{rank}"


def make_arena(root: Path, config: FlatCakeConfig, pages: ArenaPages, rank: int,
               capacity: int) -> Path:
    """The shared arena file of ``rank``: one path per root, kept across service
    restarts (never unlinked nor shrunk: workers attached before a restart keep
    their mapping of it, so every engine reads the one arena). What an earlier
    service left in it is not in these books and is overwritten as it is
    allocated again. One there that is not a private file of ours is refused
    (``link.trust.open_private``). On hugetlbfs it is sized in whole huge pages and
    reserved now (a page the pool could not give later would kill the engine touching
    it)."""
    path = arena_path(root, config, rank)
    arena_dir = path.parent
    size = capacity
    if pages.explicit and capacity:
        page = os.statvfs(arena_dir).f_bsize  # hugetlbfs: its huge page size
        size = -(-capacity // page) * page
    # node_arena_dir is shared (/dev/shm): a file or symlink another user planted at
    # this predictable name is refused, never adopted nor followed.
    fd = trust.open_private(path, "the arena file")
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        if pages.explicit and size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise ValueError(
                    f"store.node_arena_dir={arena_dir} (hugetlbfs) cannot reserve "
                    f"{size} B of huge pages for the arena ({exc.strerror}): raise "
                    "/proc/sys/vm/nr_hugepages, lower store.memory_capacity_bytes, or "
                    "point store.node_arena_dir at /dev/shm") from None
        else:
            check_room(fd, arena_dir, size)
    finally:
        os.close(fd)
    return path

def check_room(fd: int, arena_dir: Path, size: int) -> None:
    """Warn when the arena's mount cannot hold the pages not written yet: a page it
    cannot give kills the engine touching it (SIGBUS), so say it now."""
    held = os.fstat(fd).st_blocks * 512
    vfs = os.statvfs(arena_dir)
    free = vfs.f_bavail * vfs.f_frsize
    if size - held > free:
        logger.warning("store.node_arena_dir=%s has %d B free, the arena needs %d B "
                       "more as it fills: an engine writing past that is killed "
                       "(SIGBUS); lower store.memory_capacity_bytes or give the mount "
                       "more room (tmpfs size=)", arena_dir, free, size - held)
