"""Checksums beside the reads: the reader thread that completes a read computes the
crc32 of each piece it delivered (ISA-L's crc32 releases the GIL, so the reader threads
check in parallel while the restore thread scatters); the restore thread only combines
them (``staging.StagingWindow``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

from flatcake.cio.crc import crc32
from flatcake.cio.readers import IoVec


def crc_pieces(spans: tuple[tuple[tuple[int, int], tuple[memoryview, ...]], ...],
               out: Future[dict[tuple[int, int], int]], read: Future[int]) -> None:
    """Runs on the reader thread that completed ``read``: crc32 of each piece it
    delivered (keyed by its staging ``(offset, length)``; its bytes are the views, in
    order), then resolves ``out`` with them, or with the read's error."""
    exc = read.exception()
    if exc is not None:
        out.set_exception(exc)
        return
    try:
        crcs = {key: crc_views(views) for key, views in spans}
    except BaseException as err:  # never leave the restore waiting on ``out``
        out.set_exception(err)
        return
    out.set_result(crcs)


def crc_views(views: Sequence[memoryview]) -> int:
    crc = 0
    for v in views:
        crc = crc32(v, crc)
    return crc


class OpGate:
    """One read op issued as several vectored commands: the thread completing the last
    one computes the op's piece crcs (a piece may span commands) and resolves ``out``."""

    def __init__(self, keys: list[tuple[int, int]], check: bool,
                 out: Future[dict[tuple[int, int], int]]) -> None:
        self._keys = keys
        self._check = check
        self._out = out
        self._lock = threading.Lock()
        self._pending = 1  # held until close(): no early finish while still submitting
        self._error: BaseException | None = None
        self._views: list[list[memoryview]] = [[] for _ in keys]

    def expect(self, iov: IoVec, pieces: list[tuple[int, int, int]]) -> None:
        with self._lock:
            self._pending += 1
        for k, lo, hi in pieces:
            self._views[k].extend(iov.views[lo:hi])

    def done(self, read: Future[int]) -> None:
        exc = read.exception()
        with self._lock:
            if exc is not None and self._error is None:
                self._error = exc
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._finish()

    def close(self) -> None:
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        if self._error is not None:
            self._out.set_exception(self._error)
            return
        crc_pieces(tuple(zip(self._keys, map(tuple, self._views), strict=True))
                    if self._check else (), self._out, _DONE)


_DONE: Future[int] = Future()
_DONE.set_result(0)
