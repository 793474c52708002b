"""The store's session files on disk: create, adopt on restart, grow, cut, delete,
quarantine.

Directory layout under the store root (directories 0700, files 0600)::

    ROOT/
      LOCK                       flock()ed by the one store that has ROOT open
      sessions/<file_id>.fcs     live session files (cio.format)
      sessions/.<name>.tmp       a file being created (header written and synced,
                                 then renamed into place); left over only by a
                                 crash, removed when the root is next locked
      quarantine/<file_id>.fcs   files whose file header is damaged, pulled out of
                                 service and kept for inspection; never read again
      damage.log                 one JSON line per file cut, deleted or quarantined
                                 for damage (``journal``; ``flatcake fsck`` lists it)

A damaged *segment* does not send its file to quarantine: the file is cut before it
(``truncate``), so the turns before it stay served.

Crash consistency: a file appears under its name only once its header is durable
(temp name, fdatasync, rename, fsync of the directory), so a crash while creating one
leaves at most a temp file. Nothing is preallocated: a file is exactly as long as its
segments (writes extend it; ``shrink`` after a failed write and ``adopt`` on restart
trim what a failed or interrupted write left), so the bytes on disk are the bytes the
SSD budget counts, and the file's size is where its clean end is: zeros or garbage
before it are damage, never "preallocated space" (a 64 MiB preallocation step used to
let 10 tiny sessions take 80x an 8 MiB budget and made a zeroed header page look like
the end of the file).

File names are the 16 hex digits of a file id; session ids live only inside files.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from flatcake.cio.direct import (
    FILE_MODE,
    aligned_buffer,
    ensure_dir,
    ensure_private_dir,
    fsync_dir,
    open_file,
    pwrite_all,
    writable_view,
)
from flatcake.cio.format import (
    FILE_HEADER_BYTES,
    FileHeader,
    FormatError,
    decode_file_header,
    session_file_name,
)
from flatcake.cio.holes import punch
from flatcake.cio.names import DAMAGE_LOG, LOCK_FILE, QUARANTINE_DIR, SESSIONS_DIR
from flatcake.cio.names import session_files_in as session_files_in  # its old home
from flatcake.cio.restore import OpenFile
from flatcake.cio.writer import write_file_header
from flatcake.layout import ALIGN

logger = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"


@dataclass(slots=True)
class _LiveFile:
    """One open session file (mutable; owned by ``SessionFiles`` under the store lock).

    Attributes:
        path, fd: the file and its descriptor (O_DIRECT in direct mode).
        header: its file header.
        allocated_bytes: how far writes were allowed to extend the file.
    """

    path: str
    fd: int
    header: FileHeader
    allocated_bytes: int


class SessionFiles:
    """Open session files of one store root. Not thread-safe: the store calls it under
    its lock (descriptors are then used for I/O outside the lock; a file is only closed
    when its session is unpinned, so no I/O can be in flight on it)."""

    def __init__(self, root: str | os.PathLike[str], io_mode: str) -> None:
        self.root = Path(root)
        self.io_mode = io_mode
        self.sessions_dir = self.root / SESSIONS_DIR
        self.quarantine_dir = self.root / QUARANTINE_DIR
        ensure_private_dir(self.root)
        ensure_private_dir(self.sessions_dir)
        self._files: dict[int, _LiveFile] = {}
        self._lock_fd = -1

    def lock_root(self) -> None:
        """Take the root's exclusive lock (one store per root at a time)."""
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"store root {self.root} is already open in another store "
                             f"(its {LOCK_FILE} file is locked)") from None
        self._lock_fd = fd
        for entry in self.sessions_dir.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIX):
                logger.warning("removing %s, left by a crash while it was created", entry)
                entry.unlink(missing_ok=True)

    def __contains__(self, file_id: int) -> bool:
        return file_id in self._files

    def open_file(self, file_id: int) -> OpenFile:
        f = self._files[file_id]
        return OpenFile(f.path, f.fd)

    def header(self, file_id: int) -> FileHeader:
        return self._files[file_id].header

    def file_ids(self) -> list[int]:
        return sorted(self._files)

    def create(self, header: FileHeader) -> None:
        """Create a new session file holding just its header, durable: written under a
        temp name, synced, renamed into place, directory synced. Never replaces a file
        that exists (``FileExistsError``)."""
        name = session_file_name(header.file_id)
        path = self.sessions_dir / name
        tmp = self.sessions_dir / f".{name}{TEMP_SUFFIX}"
        if path.exists() or header.file_id in self._files:
            raise FileExistsError(f"session file {path} already exists")
        tmp.unlink(missing_ok=True)
        fd = open_file(tmp, self.io_mode, create=True)
        try:
            write_file_header(fd, header)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        try:
            fsync_dir(self.sessions_dir)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._files[header.file_id] = _LiveFile(str(path), fd, header, FILE_HEADER_BYTES)

    def adopt(self, path: Path, header: FileHeader, valid_end_bytes: int,
              cut: bool = False) -> None:
        """Restart: keep serving ``path``, truncated at ``valid_end_bytes`` (a damaged
        tail, ``cut``, or space a crashed write reserved) so appends continue after the
        last valid segment and the disk holds only what the budget counts."""
        fd = open_file(path, self.io_mode)
        try:
            if os.fstat(fd).st_size > valid_end_bytes:
                if cut:
                    logger.warning("session file %s cut at %d", path, valid_end_bytes)
                    self.journal("cut", path, "damaged segment found on restart or repair",
                                 end_bytes=valid_end_bytes)
                os.ftruncate(fd, valid_end_bytes)
                os.fsync(fd)
            size = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise
        self._files[header.file_id] = _LiveFile(str(path), fd, header, size)

    def wait_for(self, file_id: int, wait_s: float) -> bool:
        """Shared root: wait up to ``wait_s`` for the file another process is creating
        (it appears whole: created under a temporary name, then renamed); whether it
        is there. Touches nothing of ``self``'s, so callers wait without their lock."""
        if file_id in self._files:
            return True
        path = self.sessions_dir / session_file_name(file_id)
        deadline = time.monotonic() + wait_s
        pause = 0.0005
        while not path.exists():
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return True

    def attach(self, file_id: int) -> bool:
        """Shared root (a node service's): open a live file another process created,
        as it is (nothing trimmed: the service recovered the root, and other writers
        may be appending to it). False when it is not there (or its header is not a
        session file's)."""
        if file_id in self._files:
            return True
        path = self.sessions_dir / session_file_name(file_id)
        try:
            fd = open_file(path, self.io_mode)
        except FileNotFoundError:
            return False
        try:
            buf = aligned_buffer(FILE_HEADER_BYTES, pin=False)
            n = os.preadv(fd, [writable_view(buf)], 0)
            header = decode_file_header(writable_view(buf)[:n])
            size = os.fstat(fd).st_size
        except (OSError, FormatError) as exc:
            os.close(fd)
            logger.warning("cannot attach session file %s: %s", path, exc)
            return False
        self._files[file_id] = _LiveFile(str(path), fd, header, size)
        return True

    def ensure_allocated(self, file_id: int, end_bytes: int) -> None:
        """Let the next write extend the file to ``end_bytes`` (never past its span).
        Nothing is preallocated (see the module docstring)."""
        f = self._files[file_id]
        if end_bytes > f.header.span_bytes:
            raise ValueError(f"session file {f.path}: {end_bytes} bytes exceed its span "
                             f"{f.header.span_bytes}")
        f.allocated_bytes = max(f.allocated_bytes, end_bytes)

    def shrink(self, file_id: int, end_bytes: int) -> None:
        """After a failed write: give back the allocation past ``end_bytes`` (the books'
        append pointer), best effort."""
        f = self._files[file_id]
        if f.allocated_bytes <= end_bytes:
            return
        try:
            os.ftruncate(f.fd, end_bytes)
            f.allocated_bytes = end_bytes
        except OSError as exc:
            logger.warning("could not shrink %s to %d: %s", f.path, end_bytes, exc)

    def release(self, file_id: int, pages: tuple[tuple[int, int], ...]) -> int:
        """Punch the whole pages ``pages`` (``(start, end)`` file offsets) out of the
        file: window rows a newer turn superseded (``cio.holes``; the hole is their
        record on disk). Returns the bytes given back; 0 when the file is gone or the
        filesystem refuses (logged: the books no longer serve those rows either way)."""
        f = self._files.get(file_id)
        if f is None:
            return 0
        done = 0
        try:
            for start, end in pages:
                punch(f.fd, start, end)
                done += end - start
        except OSError as exc:
            logger.warning("could not release %d bytes of %s: %s",
                           sum(b - a for a, b in pages) - done, f.path, exc)
        return done

    def header_damage(self, file_id: int) -> str:
        """Why the file header on disk is not this file's header, or "" if it is.
        (Restores never read the header, so a damaged one is found here or on restart.)"""
        f = self._files[file_id]
        buf = aligned_buffer(FILE_HEADER_BYTES, pin=False)
        try:
            n = os.preadv(f.fd, [writable_view(buf)], 0)
            header = decode_file_header(writable_view(buf)[:n])
        except (OSError, FormatError) as exc:
            return str(exc)
        if header != f.header:
            return "file header differs from the one the file was opened with"
        return ""

    def truncate(self, file_id: int, end_bytes: int) -> None:
        """Cut the file at ``end_bytes`` (durably) so the segments after it are gone on
        disk too: a restart cannot find them, and appends continue there. If the
        filesystem refuses, the first 4 KiB at ``end_bytes`` are zeroed instead: a scan
        reads that page as damage (never as a segment), so the next restart or
        ``fsck --repair`` cuts the file there and nothing past it is served."""
        f = self._files[file_id]
        self.journal("cut", Path(f.path), "damaged segment found by a restore",
                     end_bytes=end_bytes)
        try:
            os.ftruncate(f.fd, end_bytes)
            os.fsync(f.fd)
            f.allocated_bytes = end_bytes
        except OSError as exc:
            logger.warning("could not truncate %s at %d (%s); scrubbing instead", f.path,
                           end_bytes, exc)
            pwrite_all(f.fd, writable_view(aligned_buffer(ALIGN, pin=False).zero_()),
                       end_bytes)
            os.fsync(f.fd)

    def _close(self, file_id: int) -> _LiveFile:
        f = self._files.pop(file_id)
        os.close(f.fd)
        return f

    def delete(self, file_id: int) -> None:
        if file_id not in self._files:
            return
        f = self._close(file_id)
        Path(f.path).unlink(missing_ok=True)

    def quarantine(self, file_id: int) -> Path | None:
        """Move a live file out of service, into ``quarantine/``."""
        if file_id not in self._files:
            return None
        f = self._close(file_id)
        ensure_dir(self.quarantine_dir)
        dest = self.quarantine_dir / Path(f.path).name
        os.replace(f.path, dest)
        logger.warning("session file %s moved to %s: its file header is damaged", f.path, dest)
        self.journal("quarantine", dest, "file header damaged")
        return dest

    def quarantine_path(self, path: Path, why: str = "not a readable session file") -> Path:
        """Move a file that could not be opened as a session file into quarantine."""
        ensure_dir(self.quarantine_dir)
        dest = self.quarantine_dir / path.name
        os.replace(path, dest)
        self.journal("quarantine", dest, why)
        return dest

    def journal(self, action: str, path: Path, why: str, **extra: int) -> None:
        """Append one line to ``ROOT/damage.log`` (best effort: a full disk must not
        stop a cut). ``action`` is "cut", "delete" or "quarantine"."""
        entry = {"time": round(time.time(), 3), "action": action, "file": path.name,
                 "why": why, **extra}
        try:
            fd = os.open(self.root / DAMAGE_LOG,
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            try:
                os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            logger.warning("could not record %s of %s in %s: %s", action, path, DAMAGE_LOG,
                           exc)

    def close(self) -> None:
        for file_id in list(self._files):
            self._close(file_id)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
