"""crc32 for the data path: a fast crc32 (ISA-L when installed, else zlib's, same
values) and zlib's ``crc32_combine`` with a reusable shift operator, so the crcs of
pieces read by different threads combine into a segment layer's crc.

Checksums beside the reads: the reader thread that completes a read computes the crc32
of each piece it delivered (``crc_pieces``, ``OpGate``; ISA-L's crc32 releases the GIL,
so the reader threads check in parallel while the restore thread scatters); the restore
thread only combines them (``staging.StagingWindow``)."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from flatcake.cio.readers import IoVec


def _fast_crc32() -> Callable[[memoryview | bytes | bytearray, int], int]:
    """ISA-L's crc32 (``isal`` package, PCLMUL; same values as zlib's, about 6x faster
    per CPU second on the reference machine: 20 against 3 GB/s on 64 MiB buffers) when
    installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    return isal_zlib.crc32


_CRC32 = _fast_crc32()


def crc32(data: memoryview | bytes | bytearray, value: int = 0) -> int:
    """zlib's crc32 (releases the GIL on large buffers, so several threads can check
    several ranges at once)."""
    return _CRC32(data, value) & 0xFFFFFFFF


_CRC_POLY = 0xEDB88320  # reflected CRC-32 polynomial (zlib's)


def _gf2_times(matrix: tuple[int, ...], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def crc32_shift_operator(num_bytes: int) -> tuple[int, ...]:
    """The GF(2) matrix (32 columns) that appends ``num_bytes`` zero bytes to a crc32,
    so ``crc32(a + b) == apply(op(len(b)), crc32(a)) ^ crc32(b)`` (zlib's
    ``crc32_combine``, with the operator kept for reuse: combining chunks of one size
    then costs 32 xors each). Building one costs O(log num_bytes) matrix squarings."""
    if num_bytes < 0:
        raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
    one_bit = (_CRC_POLY, *(1 << n for n in range(31)))
    op: tuple[int, ...] = one_bit
    for _ in range(3):  # one zero byte = eight zero bits
        op = tuple(_gf2_times(op, c) for c in op)
    result = tuple(1 << n for n in range(32))  # identity
    n = num_bytes
    while n:
        if n & 1:
            result = tuple(_gf2_times(op, c) for c in result)
        op = tuple(_gf2_times(op, c) for c in op)
        n >>= 1
    return result


def crc32_combine(crc_a: int, crc_b: int, operator: tuple[int, ...]) -> int:
    """crc32 of ``a + b`` from crc32(a), crc32(b) and ``crc32_shift_operator(len(b))``."""
    return _gf2_times(operator, crc_a) ^ crc_b


class BlockCrcs:
    """The running crc32 of one layer's bytes, fed in pieces of any size, recorded at
    every block boundary: ``prefixes[k]`` is the crc32 of blocks ``0..k`` (the last
    one is the layer's crc). A segment stores these (format version 4) so a restore
    can check any run of blocks it reads (``range_crc``) without reading the rest."""

    __slots__ = ("block_bytes", "crc", "into", "prefixes")

    def __init__(self, block_bytes: int, crc: int = 0) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
        self.block_bytes = block_bytes
        self.crc = crc
        self.into = 0
        self.prefixes: list[int] = []

    def feed(self, data: memoryview) -> None:
        mv = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        size, bb, out, f = len(mv), self.block_bytes, self.prefixes, _CRC32
        pos, crc = 0, self.crc
        if self.into:  # finish the block a previous piece began
            take = min(size, bb - self.into)
            crc = f(mv[:take], crc) & 0xFFFFFFFF
            pos, self.into = take, self.into + take
            if self.into == bb:
                out.append(crc)
                self.into = 0
        whole = pos + (size - pos) // bb * bb
        for at in range(pos, whole, bb):
            crc = f(mv[at:at + bb], crc) & 0xFFFFFFFF
            out.append(crc)
        if whole < size:
            crc = f(mv[whole:], crc) & 0xFFFFFFFF
            self.into = size - whole
        self.crc = crc


_ZEROS = memoryview(bytes(1 << 18))
_POW_OPS: list[tuple[int, ...]] = []  # _POW_OPS[k]: crc32_shift_operator(2 ** k)


def _shift(crc: int, num_bytes: int) -> int:
    """``crc32(zeros(num_bytes), crc) ^ crc32(zeros(num_bytes))``: the crc of a prefix
    moved past ``num_bytes`` more bytes (crc32 is affine in its data and start value).
    Up to 256 KiB: crc32 over zeros (at most ~13 us); longer: one cached power-of-two
    shift operator per set bit of ``num_bytes`` (32 xors each), so a partial restore's
    check never costs a second pass over the bytes it reads."""
    if num_bytes <= len(_ZEROS):
        zeros = _ZEROS[:num_bytes]
        return (_CRC32(zeros, crc) ^ _CRC32(zeros, 0)) & 0xFFFFFFFF
    if not _POW_OPS:
        op = crc32_shift_operator(1)
        for _ in range(64):
            _POW_OPS.append(op)
            op = tuple(_gf2_times(op, c) for c in op)
    k = 0
    while num_bytes:
        if num_bytes & 1:
            crc = _gf2_times(_POW_OPS[k], crc)
        num_bytes >>= 1
        k += 1
    return crc


def range_crc(prefixes: tuple[int, ...], first: int, count: int, block_bytes: int) -> int:
    """crc32 of blocks ``[first, first + count)`` of a layer from its running block crcs
    (``BlockCrcs.prefixes``): ``P[end] ^ shift(P[first], count * block_bytes)``."""
    if count <= 0 or first < 0 or first + count > len(prefixes):
        raise ValueError(f"blocks [{first}, {first + count}) outside a layer of "
                         f"{len(prefixes)} blocks")
    end = prefixes[first + count - 1]
    if first == 0:
        return end
    return end ^ _shift(prefixes[first - 1], count * block_bytes)


class SegmentCrcs(NamedTuple):
    """What checks a stored segment's bytes: each layer's crc32 and, for a segment of
    format version 4, each layer's running block crcs (``BlockCrcs.prefixes``)."""

    layers: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...] | None = None

    def over(self, check: RowsChecked, layer_block_bytes: tuple[int, ...]
             ) -> tuple[int, ...] | None:
        """crc32 of each layer's checked blocks (``check.first`` on, ``num_blocks`` of
        them, less the leading ones a sliding-window layer does not hold: 0 when it
        holds none); None when the segment has no block crcs (only its whole layers can
        be checked)."""
        if self.blocks is None:
            return None
        out = []
        for layer, (table, size) in enumerate(zip(self.blocks, layer_block_bytes,
                                                  strict=True)):
            skip = check.layer_skip(layer)
            count = check.num_blocks - skip
            rows = check.row_first or check.layer_first
            held = rows[layer] if rows else 0
            row = check.first + skip - held  # the table holds the layer's rows only
            out.append(range_crc(table, row, count, size) if count else 0)
        return tuple(out)


class RowsChecked(Protocol):
    """Which blocks of a segment a restore checks (``plan.stream.StreamCheck``)."""

    @property
    def first(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def layer_first(self) -> tuple[int, ...]: ...
    @property
    def row_first(self) -> tuple[int, ...]: ...
    def layer_skip(self, layer: int) -> int: ...


# -- checksums beside the reads (on the reader threads) ------------------------------


class PieceCrcs:
    """The crcs of one read op's pieces, handed from the reader thread that computes
    them to the restore thread that waits for them: ``(slot offset, length) -> crc32``
    (empty when nothing is checked), or the read's error. Set once, by one thread. A
    bare lock rather than a ``Future`` (one per op: no condition, no callbacks)."""

    __slots__ = ("_crcs", "_error", "_ready")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()  # released once the crcs (or the error) are in
        self._crcs: dict[tuple[int, int], int] = {}
        self._error: BaseException | None = None

    def set_result(self, crcs: dict[tuple[int, int], int]) -> None:
        self._crcs = crcs
        self._ready.release()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._ready.release()

    def result(self) -> dict[tuple[int, int], int]:
        """Wait until set; the crcs, or raise the read's error."""
        with self._ready:
            pass
        if self._error is not None:
            raise self._error
        return self._crcs


def crc_pieces(spans: tuple[tuple[tuple[int, int], tuple[memoryview, ...]], ...],
               out: PieceCrcs, read: Future[int]) -> None:
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
    """crc32 of ``views`` concatenated. One call of the fast crc32 per view, with no
    Python wrapper in between: a restore checks one view per 64 KiB block."""
    crc, f = 0, _CRC32
    for v in views:
        crc = f(v, crc)
    return crc & 0xFFFFFFFF


class OpGate:
    """One read op issued as several vectored commands: the thread completing the last
    one computes the op's piece crcs (a piece may span commands) and resolves ``out``."""

    def __init__(self, keys: list[tuple[int, int]], check: bool, out: PieceCrcs) -> None:
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
