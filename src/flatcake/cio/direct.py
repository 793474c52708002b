"""O_DIRECT plumbing: aligned buffers, direct-I/O probing, file and directory creation,
and whole-buffer positional writes.

Direct I/O needs three things aligned to 4096 bytes: the buffer address, the file
offset and the length. ``aligned_buffer`` gives buffers that satisfy the first (pinned
when CUDA is present, so a later host-to-GPU copy is a DMA; otherwise, from 2 MiB up,
backed by transparent huge pages, see ``cio.hugepages``); the segment layout
guarantees the other two.

Whether a filesystem accepts O_DIRECT is probed, not guessed from its name (tmpfs
refuses it on older kernels and accepts it since Linux 6.6; overlay filesystems vary).
``resolve_io_mode`` turns the configured ``store.io_mode`` into the mode actually used
and is never silent about buffered I/O.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flatcake.cio.hugepages import HUGE_PAGE
from flatcake.layout import ALIGN, align_up

logger = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700
IO_MODES = ("auto", "direct", "buffered")


class DirectIOUnsupported(ValueError):
    """``store.io_mode='direct'`` on a filesystem that refuses O_DIRECT."""


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def aligned_buffer(num_bytes: int, pin: bool | None = None) -> torch.Tensor:
    """A CPU ``uint8`` tensor of ``num_bytes`` whose first byte is 4096-aligned.

    ``pin=None`` pins when CUDA is available. The returned tensor is a view into a
    slightly larger allocation, which it keeps alive. An unpinned buffer of at least
    ``HUGE_PAGE`` bytes is a private anonymous mapping, 2 MiB-aligned and advised
    ``MADV_HUGEPAGE``: the kernel backs it with huge pages where it offers them (THP
    mode ``always`` or ``madvise``), so direct reads into it go to the device as a few
    large requests instead of many 4 KiB-page-sized pieces.
    """
    if num_bytes < 0:
        raise ValueError(f"aligned_buffer num_bytes must be >= 0, got {num_bytes}")
    if pin is None:
        pin = cuda_available()
    if not pin and num_bytes >= HUGE_PAGE:
        return _huge_page_buffer(num_bytes)
    raw = torch.empty(align_up(max(num_bytes, 1)) + ALIGN, dtype=torch.uint8, pin_memory=pin)
    shift = (-raw.data_ptr()) % ALIGN
    return raw[shift:shift + num_bytes]


def _huge_page_buffer(num_bytes: int) -> torch.Tensor:
    size = -(-num_bytes // HUGE_PAGE) * HUGE_PAGE
    mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping alive
    shift = (-raw.data_ptr()) % HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mapping.madvise(advice, shift, size)
        except OSError as exc:  # a kernel without THP: plain pages, still aligned
            logger.debug("madvise(MADV_HUGEPAGE) refused: %s", exc)
    return raw[shift:shift + num_bytes]


def writable_view(buf: torch.Tensor) -> memoryview:
    """A writable byte memoryview over a contiguous CPU uint8 tensor (for preadv)."""
    if buf.device.type != "cpu" or buf.dtype != torch.uint8 or not buf.is_contiguous():
        raise ValueError(
            f"buffer must be a contiguous CPU uint8 tensor, got device={buf.device} "
            f"dtype={buf.dtype} contiguous={buf.is_contiguous()}"
        )
    return memoryview(buf.numpy().data).cast("B")


def is_aligned(value: int) -> bool:
    return value % ALIGN == 0


def filesystem_type(path: str | os.PathLike[str]) -> str:
    """Type of the filesystem holding ``path`` (from /proc/self/mountinfo), or "unknown"."""
    target = os.path.realpath(os.fspath(path))
    best, best_type = "", "unknown"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                left, sep, right = line.partition(" - ")
                fields = left.split()
                if not sep or len(fields) < 5:
                    continue
                mount_point = fields[4].replace("\\040", " ")
                inside = target == mount_point or target.startswith(
                    mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, right.split()[0]
    except OSError:
        return "unknown"
    return best_type


@dataclass(frozen=True, slots=True)
class DirectIOProbe:
    """Outcome of trying an aligned O_DIRECT write and read in ``directory``.

    Attributes:
        directory: where the probe file was created.
        fs_type: the filesystem type (e.g. ext4, xfs, tmpfs).
        supported: True if the kernel accepted both.
        reason: the error when not supported, else "".
    """

    directory: str
    fs_type: str
    supported: bool
    reason: str = ""


def probe_direct_io(directory: str | os.PathLike[str]) -> DirectIOProbe:
    """Create a throw-away file in ``directory`` and do one aligned O_DIRECT write and
    read. The directory must exist."""
    directory = os.fspath(directory)
    fs_type = filesystem_type(directory)
    if not hasattr(os, "O_DIRECT"):
        return DirectIOProbe(directory, fs_type, False, "this platform has no O_DIRECT")
    fd_plain, name = tempfile.mkstemp(prefix=".flatcake-probe-", dir=directory)
    os.close(fd_plain)
    buf = aligned_buffer(ALIGN, pin=False)
    buf.fill_(0x5A)
    try:
        fd = os.open(name, os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
        try:
            view = writable_view(buf)
            if os.pwrite(fd, view, 0) != ALIGN or os.preadv(fd, [view], 0) != ALIGN:
                return DirectIOProbe(directory, fs_type, False, "short O_DIRECT transfer")
        finally:
            os.close(fd)
    except OSError as exc:
        return DirectIOProbe(directory, fs_type, False,
                             f"{errno.errorcode.get(exc.errno or 0, '?')}: {exc.strerror}")
    finally:
        os.unlink(name)
    return DirectIOProbe(directory, fs_type, True)


def resolve_io_mode(
    directory: str | os.PathLike[str], io_mode: str,
    probe: Callable[[str], DirectIOProbe] | None = None,
) -> str:
    """The I/O mode to use in ``directory``: "direct" or "buffered".

    - "direct": O_DIRECT or ``DirectIOUnsupported`` naming the path and filesystem;
    - "buffered": page-cache I/O, with one warning saying so;
    - "auto": direct if the probe passes, else buffered with a warning naming why.
    Called once per store open, so each warning is logged once per store.
    """
    if io_mode not in IO_MODES:
        raise ValueError(f"store.io_mode must be one of {IO_MODES}, got {io_mode!r}")
    directory = os.fspath(directory)
    if io_mode == "buffered":
        logger.warning(
            "store.io_mode=buffered: session files under %s use the page cache, not O_DIRECT; "
            "restores compete with host memory and timings include cache effects", directory)
        return "buffered"
    result = (probe if probe is not None else probe_direct_io)(directory)
    if result.supported:
        logger.debug("O_DIRECT supported in %s (%s)", directory, result.fs_type)
        return "direct"
    if io_mode == "direct":
        raise DirectIOUnsupported(
            f"store.io_mode='direct' but {directory} (filesystem {result.fs_type}) does not "
            f"support O_DIRECT ({result.reason}); use a filesystem that does (ext4, xfs) or "
            f"set store.io_mode to 'auto' or 'buffered'"
        )
    logger.warning(
        "store.io_mode=auto: %s (filesystem %s) does not support O_DIRECT (%s); falling back "
        "to buffered page-cache I/O", directory, result.fs_type, result.reason)
    return "buffered"


class NotADirectory(ValueError):
    """A path that must be a directory (a store root or one of its parents) is not."""


def ensure_dir(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and any missing parents with mode 0700; existing directories are
    left as they are. ``NotADirectory`` names a path on the way that is a file."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return
    if os.path.lexists(path):
        raise NotADirectory(f"{path} exists and is not a directory")
    ensure_dir(os.path.dirname(path))
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectory(f"{path} exists and is not a directory") from None
        return
    os.chmod(path, DIR_MODE)  # exact mode whatever the umask


def ensure_private_dir(path: str | os.PathLike[str]) -> None:
    """``ensure_dir``, then tighten an existing directory that is readable or writable
    by others to 0700 (a store's root and its subdirectories hold other tenants' KV)."""
    ensure_dir(path)
    mode = os.stat(path).st_mode & 0o777
    if mode != DIR_MODE:
        os.chmod(path, DIR_MODE)
        logger.warning("directory %s had mode %o; set to %o", os.fspath(path), mode, DIR_MODE)


def open_file(path: str | os.PathLike[str], io_mode: str, *, create: bool = False,
              writable: bool = True) -> int:
    """Open a session file for positional I/O; ``create`` makes a new one (mode 0600,
    failing if it exists)."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    if create:
        flags |= os.O_CREAT | os.O_EXCL
    if io_mode == "direct":
        flags |= os.O_DIRECT
    fd = os.open(os.fspath(path), flags, FILE_MODE)
    if create:
        os.fchmod(fd, FILE_MODE)  # exact mode whatever the umask
    return fd


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (a new file's name) durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset`` (looping over short writes); return the number
    of write calls made."""
    calls, done = 0, 0
    total = len(data)
    while done < total:
        n = os.pwrite(fd, data[done:], offset + done)
        calls += 1
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes at offset {offset + done}")
        done += n
    return calls


def pwritev_all(fd: int, views: Sequence[memoryview], offset: int) -> int:
    """Write ``views`` back to back at ``offset`` with ``os.pwritev`` (at most
    ``IOV_MAX`` views; looping over short writes); return the number of write calls."""
    pending = list(views)
    calls, done = 0, 0
    while pending:
        n = os.pwritev(fd, pending, offset + done)
        calls += 1
        if n <= 0:
            raise OSError(errno.EIO, f"pwritev wrote {n} bytes at offset {offset + done}")
        done += n
        skip = 0
        while skip < len(pending) and n >= len(pending[skip]):
            n -= len(pending[skip])
            skip += 1
        del pending[:skip]
        if n:
            pending[0] = pending[0][n:]
    return calls


def scrub_page(fd: int, file_offset: int) -> None:
    """Zero the 4 KiB at ``file_offset`` and sync, best effort (a failure is logged).
    After a failed segment write this keeps a header that did reach the disk from
    passing for a segment on restart; the range is still that write's allocation, so
    nothing else writes there."""
    zeros = aligned_buffer(ALIGN, pin=False).zero_()
    try:
        pwrite_all(fd, writable_view(zeros), file_offset)
        os.fdatasync(fd)
    except OSError as exc:
        logger.warning("could not scrub a failed segment write at %d: %s", file_offset, exc)
