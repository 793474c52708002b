"""Readers execute direct reads of session-file ranges into staging buffers.

Two implementations of one contract:

- ``DirectReader``: ``os.preadv`` from a thread pool into page-aligned host buffers
  (pinned when CUDA is present), several reads in flight. Works on every Linux box.
- ``GdsReader``: kvikio / GPUDirect Storage straight into a GPU buffer, used when CUDA
  and kvikio are present. kvikio is imported lazily here and nowhere else.

A reader is shared by every restore of a store. ``ReadQueue`` sits between one restore
and the reader and bounds how many of that restore's commands are in flight at once
(``store.reads_in_flight``): enough to keep the device's queue busy, without one large
restore flooding the reader's queue ahead of every other restore (or, with GDS,
handing kvikio an unbounded number of commands).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from flatcake.cio.affinity import start_threads
from flatcake.cio.direct import is_aligned, writable_view
from flatcake.layout import ALIGN


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
        # One test for the usual case (a restore makes one request per 8 MiB command).
        if (self.file_offset | self.length | self.dest_offset) % ALIGN or min(
                self.file_offset, self.length, self.dest_offset) < 0:
            for name in ("file_offset", "length", "dest_offset"):
                value = getattr(self, name)
                if value < 0 or not is_aligned(value):
                    raise ValueError(
                        f"ReadRequest.{name} must be a multiple of 4096, got {value}")
        if self.length == 0:
            raise ValueError("ReadRequest.length must be > 0, got 0")


@dataclass(frozen=True, slots=True)
class IoVec:
    """Destination of a vectored read (``preadv``): the request's bytes fill ``views``
    in order. Every view's address and length is a multiple of 4096 (O_DIRECT), their
    lengths sum to the request's length (whose ``dest_offset`` must be 0), and there
    are at most ``IOV_MAX`` of them. Only ``DirectReader`` takes one."""

    views: tuple[memoryview, ...]


IOV_MAX = 1024  # Linux UIO_MAXIOV: most iovecs one preadv takes


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
        - ``dest`` is an ``IoVec`` (``DirectReader`` only: a vectored read into host
          memory the caller owns), or a contiguous ``uint8`` tensor in the reader's
          ``device_type``:
          pinned host memory for ``DirectReader``, CUDA memory for ``GdsReader``. The
          caller keeps it alive and untouched until the future resolves.
        - A read is never cancelled: the future resolves with the byte count
          (== ``request.length``) or raises ``OSError`` (short read past end of file,
          I/O error).
    """

    name: str
    device_type: str

    def submit(self, request: ReadRequest, dest: torch.Tensor | IoVec) -> Future[int]: ...

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


def _check_iovec(request: ReadRequest, dest: IoVec) -> None:
    if request.dest_offset or sum(map(len, dest.views)) != request.length:
        raise ValueError(f"a vectored read needs dest_offset 0 and views summing to "
                         f"{request.length} bytes")
    if len(dest.views) > IOV_MAX:
        raise ValueError(f"a vectored read takes at most {IOV_MAX} views, got "
                         f"{len(dest.views)}")


class DirectReader:
    """``os.preadv`` on a pool of ``num_threads`` threads; one command per request (a
    short read, which the kernel may return for very large requests, is continued and
    counted as another command)."""

    name = "direct"
    device_type = "cpu"

    def __init__(self, num_threads: int) -> None:
        if num_threads < 1:
            raise ValueError(f"store.read_threads must be >= 1, got {num_threads}")
        self._num_threads = num_threads
        self._pool = ThreadPoolExecutor(max_workers=num_threads,
                                        thread_name_prefix="flatcake-read")
        self._counters = _Counters()

    def start_threads(self) -> None:
        """Start every read thread now (they inherit the calling thread's CPUs), not
        one per command on the first commands."""
        start_threads(self._pool, self._num_threads)

    def submit(self, request: ReadRequest, dest: torch.Tensor | IoVec) -> Future[int]:
        if isinstance(dest, IoVec):
            _check_iovec(request, dest)
            return self._pool.submit(self._read, request, list(dest.views))
        _check_dest(request, dest, self.device_type)
        view = writable_view(dest)[request.dest_offset:request.dest_offset + request.length]
        return self._pool.submit(self._read, request, [view])

    def _read(self, request: ReadRequest, views: list[memoryview]) -> int:
        done, commands = 0, 0
        try:
            while done < request.length:
                n = os.preadv(request.fd, views, request.file_offset + done)
                commands += 1
                if n == 0:
                    raise OSError(
                        errno.EIO,
                        f"short read: {request.path} ended at {request.file_offset + done}, "
                        f"wanted up to {request.file_offset + request.length}",
                    )
                done += n
                if done == request.length:  # the usual case: one call read it all
                    break
                while n and views:  # drop what the call filled, go on from there
                    if n >= len(views[0]):
                        n -= len(views.pop(0))
                    else:
                        views[0], n = views[0][n:], 0
        finally:
            self._counters.add(commands, done)
        return done

    def stats(self) -> ReaderStats:
        return self._counters.snapshot()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class ReadQueue:
    """At most ``max_in_flight`` commands of one restore with the reader at once.

    ``submit`` has the reader's contract (returns at once with a future, never
    cancels). Up to ``max_in_flight`` requests go to the reader immediately; later ones
    wait here, in submission order, and are handed over as earlier ones complete (by
    the thread that completes them). ``max_in_flight=None`` sets no bound. One restore
    owns a queue; ``submit`` and the completion callbacks may run on different threads
    (``self._lock`` guards the waiting list and the counts).
    """

    def __init__(self, reader: Reader, max_in_flight: int | None) -> None:
        if max_in_flight is not None and (not isinstance(max_in_flight, int)
                                          or max_in_flight < 1):
            raise ValueError(f"store.reads_in_flight must be an int >= 1, got "
                             f"{max_in_flight!r}")
        self.reader = reader
        self.max_in_flight = max_in_flight
        self._limit = sys.maxsize if max_in_flight is None else max_in_flight
        self._lock = threading.Lock()
        self._waiting: deque[tuple[ReadRequest, torch.Tensor | IoVec, Future[int]]] = deque()
        self._in_flight = 0
        self._peak = 0
        self._pumping = False
        self._idle = threading.Condition(self._lock)

    @property
    def peak_in_flight(self) -> int:
        """Most commands this queue has had with the reader at once."""
        with self._lock:
            return self._peak

    def submit(self, request: ReadRequest, dest: torch.Tensor | IoVec) -> Future[int]:
        if isinstance(dest, IoVec):  # fail now, as the reader does
            _check_iovec(request, dest)
        else:
            _check_dest(request, dest, self.reader.device_type)
        with self._lock:
            # Room, and nothing queued or being handed over (order holds): the reader's
            # own future is the answer (no second future per command).
            now = not self._waiting and not self._pumping and self._in_flight < self._limit
            if now:
                self._in_flight += 1
                self._peak = max(self._peak, self._in_flight)
            else:
                out: Future[int] = Future()
                self._waiting.append((request, dest, out))
        if now:
            return self._hand_over(request, dest)
        self._pump()
        return out

    def _hand_over(self, request: ReadRequest, dest: torch.Tensor | IoVec) -> Future[int]:
        """Give one counted-in-flight request to the reader; its future, whose first
        callback makes room (so a waiter woken by it sees the room) and pumps."""
        try:
            inner = self.reader.submit(request, dest)
        except BaseException as exc:  # a bad request fails its own future only
            inner = Future()
            inner.set_exception(exc)
        inner.add_done_callback(self._finished)
        return inner

    def _finished(self, _inner: Future[int]) -> None:
        self._done()
        self._pump()

    def _pump(self) -> None:
        """Hand waiting requests to the reader while there is room. One thread pumps at
        a time; a completion that finds a pump running leaves the work to it, so a
        reader that completes synchronously never recurses."""
        with self._lock:
            if self._pumping:
                return
            self._pumping = True
        while True:
            with self._lock:
                if not self._waiting or self._in_flight >= self._limit:
                    self._pumping = False
                    return
                request, dest, out = self._waiting.popleft()
                self._in_flight += 1
                self._peak = max(self._peak, self._in_flight)
            try:
                inner = self.reader.submit(request, dest)
            except BaseException as exc:  # a bad request fails its own future only
                out.set_exception(exc)
                self._done()
                continue
            inner.add_done_callback(partial(self._complete, out))

    def _complete(self, out: Future[int], inner: Future[int]) -> None:
        exc = inner.exception()
        self._done()  # room first, so a waiter woken by ``out`` sees it
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(inner.result())
        self._pump()

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if not self._in_flight and not self._waiting:
                self._idle.notify_all()

    def abandon(self) -> None:
        """The restore gave up: fail the requests not handed over yet, and wait until
        the reader is done with the ones that were (they write into buffers the restore
        is about to hand to the next one)."""
        with self._lock:
            dropped = list(self._waiting)
            self._waiting.clear()
        for _, _, out in dropped:
            out.set_exception(RuntimeError("restore abandoned before this read started"))
        with self._idle:
            while self._in_flight:
                self._idle.wait()


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
        self._num_threads = max(1, num_threads)
        self._pool = ThreadPoolExecutor(max_workers=self._num_threads,
                                        thread_name_prefix="flatcake-gds")
        self._counters = _Counters()

    def start_threads(self) -> None:
        """Start every waiting thread now, not one per read on the first reads."""
        start_threads(self._pool, self._num_threads)

    def _file(self, path: str) -> Any:
        with self._files_lock:
            handle = self._files.get(path)
            if handle is None:
                handle = self._kvikio.CuFile(path, "r")
                self._files[path] = handle
            return handle

    def submit(self, request: ReadRequest, dest: torch.Tensor | IoVec) -> Future[int]:
        if isinstance(dest, IoVec):
            raise ValueError("GdsReader reads into one CUDA buffer, not host iovecs")
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
