"""Giving a session file's pages back to the filesystem, and finding them again.

Window rows a newer turn superseded (``control.releases``) are punched out of their
file (``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``: the file keeps its
size and offsets, its ``st_blocks`` drop). The hole is the record on disk: a restart
(``cio.filescan``) reads a windowed layer whose first whole page is a hole
(``SEEK_DATA``) as released, so recovery rebuilds the same books. A store only
releases where ``holes_work`` shows both calls behave on its filesystem
(``releases_windows``: the one test every host's books are built with).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
from pathlib import Path

from flatcake.layout import ALIGN

_PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE
_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE
_libc: ctypes.CDLL | None = None
logger = logging.getLogger(__name__)


def punch(fd: int, start: int, end: int) -> None:
    """Free the whole pages ``[start, end)`` of ``fd`` (4 KiB aligned); they read as
    zeros after. Raises ``OSError`` when the filesystem refuses."""
    global _libc
    if start % ALIGN or end % ALIGN or end <= start:
        raise ValueError(f"punch: [{start}, {end}) is not a range of whole 4 KiB pages")
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                    ctypes.c_int64]
    if _libc.fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, start, end - start) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fallocate(PUNCH_HOLE) failed: {os.strerror(err)}")


def is_hole(fd: int, offset: int) -> bool:
    """Whether the page at ``offset`` of ``fd`` holds no data (punched)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) > offset
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no data from there to the end of the file
            return True
        raise


def holes_work(directory: str | os.PathLike[str]) -> str:
    """Why punching holes cannot be used under ``directory`` ("" when it can): a
    scratch file (removed again) gets a page punched, which must then read as a
    hole while the next page does not."""
    path = Path(directory) / f".holes-{os.getpid()}.tmp"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, b"\1" * (2 * ALIGN), 0)
            os.fsync(fd)
            punch(fd, 0, ALIGN)
            if not is_hole(fd, 0) or is_hole(fd, ALIGN):
                return "the filesystem does not report punched pages as holes (SEEK_DATA)"
            return ""
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError as exc:
        return str(exc)


def releases_windows(wanted: bool, sessions_dir: str | os.PathLike[str]) -> bool:
    """Whether the host of ``sessions_dir`` punches released window rows out of its
    files: ``wanted`` (``store.release_old_windows`` and a geometry with windows) where
    the filesystem can punch holes and find them again (the log says why not)."""
    if not wanted:
        return False
    # A scheduler may start before its workers made the directory (0700, as they do).
    os.makedirs(sessions_dir, mode=0o700, exist_ok=True)
    why = holes_work(sessions_dir)
    if why:
        logger.warning("store.release_old_windows is off for %s: %s; every turn keeps its "
                       "window rows until its session is reclaimed", sessions_dir, why)
    return not why
