"""Readers execute direct reads of session-file ranges into staging buffers.

Two implementations of one contract:

- ``DirectReader``: ``os.preadv`` from a thread pool into page-aligned host buffers
  (pinned when CUDA is present), several reads in flight. Works on every Linux box.
- ``GdsReader``: kvikio / GPUDirect Storage straight into a GPU buffer, used when CUDA
  and kvikio are present. kvikio is imported lazily here and nowhere else.
"""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from flatcake.cio.direct import is_aligned, writable_view


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One read command: file bytes ``[file_offset, file_offset + length)`` into
    ``dest[dest_offset:dest_offset + length]``.

    Attributes:
        path: the file (GDS opens by path).
        fd: an open descriptor of ``path`` (O_DIRECT in direct mode).
        file_offset, length, dest_offset: multiples of 4096.
    """

    path: str
    fd: int
    file_offset: int
    length: int
    dest_offset: int

    def __post_init__(self) -> None:
        for name in ("file_offset", "length", "dest_offset"):
            value = getattr(self, name)
            if value < 0 or not is_aligned(value):
                raise ValueError(f"ReadRequest.{name} must be a multiple of 4096, got {value}")
        if self.length == 0:
            raise ValueError("ReadRequest.length must be > 0, got 0")


@dataclass(frozen=True, slots=True)
class ReaderStats:
    """Counters since the reader was made: ``commands`` read calls issued to the kernel
    (or GDS), ``bytes_read`` bytes they returned."""

    commands: int
    bytes_read: int


class Reader(Protocol):
    """Moves file bytes into a staging buffer. Owned by one store; thread-safe.

    Contract:
        - ``submit`` may be called from any thread (the store's restore threads call
          it); it returns at once with a future resolved on the reader's own threads.
          Several submitted reads are in flight together.
        - ``request.file_offset``, ``request.length`` and ``request.dest_offset`` are
          multiples of 4096 and ``dest``'s first byte is 4096-aligned (``direct.
          aligned_buffer`` or a CUDA allocation), as O_DIRECT and GDS
          require.
        - ``dest`` is a contiguous ``uint8`` tensor in the reader's ``device_type``:
          pinned host memory for ``DirectReader``, CUDA memory for ``GdsReader``. The
          caller keeps it alive and untouched until the future resolves.
        - A read is never cancelled: the future resolves with the byte count
          (== ``request.length``) or raises ``OSError`` (short read past end of file,
          I/O error).
    """

    name: str
    device_type: str

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]: ...

    def stats(self) -> ReaderStats: ...

    def close(self) -> None: ...


class _Counters:
    """Command and byte counters; written by reader threads under their lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands = 0
        self._bytes = 0

    def add(self, commands: int, num_bytes: int) -> None:
        with self._lock:
            self._commands += commands
            self._bytes += num_bytes

    def snapshot(self) -> ReaderStats:
        with self._lock:
            return ReaderStats(self._commands, self._bytes)


def _check_dest(request: ReadRequest, dest: torch.Tensor, device_type: str) -> None:
    if dest.dtype != torch.uint8 or dest.device.type != device_type or dest.dim() != 1:
        raise ValueError(
            f"read destination must be a 1-D uint8 {device_type} tensor, got "
            f"dtype={dest.dtype} device={dest.device} shape={tuple(dest.shape)}"
        )
    if request.dest_offset + request.length > dest.numel():
        raise ValueError(
            f"ReadRequest.dest_offset+length={request.dest_offset + request.length} exceeds "
            f"the destination's {dest.numel()} bytes"
        )
    if not is_aligned(dest.data_ptr()):
        raise ValueError(f"read destination address {dest.data_ptr():#x} is not 4096-aligned")


class DirectReader:
    """``os.preadv`` on a pool of ``num_threads`` threads; one command per request (a
    short read, which the kernel may return for very large requests, is continued and
    counted as another command)."""

    name = "direct"
    device_type = "cpu"

    def __init__(self, num_threads: int) -> None:
        if num_threads < 1:
            raise ValueError(f"store.read_threads must be >= 1, got {num_threads}")
        self._pool = ThreadPoolExecutor(max_workers=num_threads,
                                        thread_name_prefix="flatcake-read")
        self._counters = _Counters()

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        _check_dest(request, dest, self.device_type)
        view = writable_view(dest)[request.dest_offset:request.dest_offset + request.length]
        return self._pool.submit(self._read, request, view)

    def _read(self, request: ReadRequest, view: memoryview) -> int:
        done, commands = 0, 0
        try:
            while done < request.length:
                n = os.preadv(request.fd, [view[done:]], request.file_offset + done)
                commands += 1
                if n == 0:
                    raise OSError(
                        errno.EIO,
                        f"short read: {request.path} ended at {request.file_offset + done}, "
                        f"wanted up to {request.file_offset + request.length}",
                    )
                done += n
        finally:
            self._counters.add(commands, done)
        return done

    def stats(self) -> ReaderStats:
        return self._counters.snapshot()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def kvikio_available() -> bool:
    """True when CUDA and kvikio are both importable and usable."""
    if not torch.cuda.is_available():
        return False
    try:
        import kvikio  # noqa: F401
    except ImportError:
        return False
    return True


class GdsReader:
    """GPUDirect Storage reads through kvikio into a CUDA staging buffer.

    kvikio runs its own I/O threads; our small pool only waits on its futures so the
    ``Reader`` contract (a ``concurrent.futures.Future``) holds."""

    name = "gds"
    device_type = "cuda"

    def __init__(self, num_threads: int) -> None:
        if not kvikio_available():
            raise RuntimeError("GdsReader needs CUDA and the kvikio package")
        import kvikio

        self._kvikio: Any = kvikio
        self._files: dict[str, Any] = {}
        self._files_lock = threading.Lock()  # guards _files; any submitting thread
        self._pool = ThreadPoolExecutor(max_workers=max(1, num_threads),
                                        thread_name_prefix="flatcake-gds")
        self._counters = _Counters()

    def _file(self, path: str) -> Any:
        with self._files_lock:
            handle = self._files.get(path)
            if handle is None:
                handle = self._kvikio.CuFile(path, "r")
                self._files[path] = handle
            return handle

    def submit(self, request: ReadRequest, dest: torch.Tensor) -> Future[int]:
        _check_dest(request, dest, self.device_type)
        target = dest[request.dest_offset:request.dest_offset + request.length]
        io_future = self._file(request.path).pread(target, request.length,
                                                   request.file_offset)
        return self._pool.submit(self._wait, request, io_future)

    def _wait(self, request: ReadRequest, io_future: Any) -> int:
        n = int(io_future.get())
        self._counters.add(1, n)
        if n != request.length:
            raise OSError(errno.EIO, f"short GDS read of {request.path}: {n} of "
                                     f"{request.length} bytes at {request.file_offset}")
        return n

    def stats(self) -> ReaderStats:
        return self._counters.snapshot()

    def forget_file(self, path: str) -> None:
        """Close the kvikio handle of a file about to be deleted."""
        with self._files_lock:
            handle = self._files.pop(path, None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._files_lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()
