"""The device ceiling: what this disk does for large sequential O_DIRECT reads and writes.

Every layout in ``flatcake bench`` is judged against these numbers, measured in the
same run on the same directory. The ceiling is taken two ways:

- in process: one file read (or written) front to back in ``chunk_bytes`` commands,
  ``in_flight`` of them outstanding at once (``in_flight`` threads, each issuing
  ``os.preadv``/``os.pwritev`` on its own page-aligned buffer; the GIL is released
  during the system call, so this is real queue depth, not Python time);
- with ``fio`` (libaio, ``--direct=1``) on the same file, when ``fio`` is installed.
  The bench runs without it; ``make fio`` runs the same jobs by hand.

Random reads of one op size (``read_random``) give the per-command ceiling that
eviction-order layouts run into: at ``num_commands / s`` IOPS a layout that needs one
command per block per layer cannot beat ``IOPS * op_bytes``.

Throughput is reported in decimal GB/s (1e9 bytes per second), as fio and device data
sheets do.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flatcake.cio import direct
from flatcake.cio.direct import writable_view

logger = logging.getLogger(__name__)

ALIGN = 4096
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_IN_FLIGHT = 16


@dataclass(frozen=True, slots=True)
class Throughput:
    """One timed transfer.

    Attributes:
        num_bytes: bytes moved by the timed commands.
        seconds: wall time from the first command issued to the last one done
            (for writes: including the final ``fsync``).
        num_commands: read or write system calls issued.
    """

    num_bytes: int
    seconds: float
    num_commands: int

    @property
    def gbps(self) -> float:
        return self.num_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def iops(self) -> float:
        return self.num_commands / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class FioResult:
    """fio's figure for one job.

    Attributes:
        rw: fio's ``--rw`` (``read``, ``write``, ``randread``).
        block_bytes: fio's ``--bs``.
        iodepth: fio's ``--iodepth`` (libaio).
        gbps: bandwidth fio reports, decimal GB/s.
        iops: commands per second fio reports.
    """

    rw: str
    block_bytes: int
    iodepth: int
    gbps: float
    iops: float


def aligned_buffer(num_bytes: int) -> memoryview:
    """Page-aligned, zero-filled memory usable for O_DIRECT transfers, backed like
    FlatCake's own buffers (``direct.aligned_buffer``: transparent huge pages from
    2 MiB up), so the device ceiling is measured with the same memory advantage."""
    if num_bytes <= 0 or num_bytes % ALIGN:
        raise ValueError(f"num_bytes must be a positive multiple of {ALIGN}, got {num_bytes}")
    return writable_view(direct.aligned_buffer(num_bytes, pin=False).zero_())


def open_direct(path: str, *, write: bool = False, create: bool = False) -> int:
    """Open ``path`` with O_DIRECT; a filesystem that refuses it gets a clear error."""
    flags = os.O_DIRECT | (os.O_RDWR if write else os.O_RDONLY)
    if create:
        flags |= os.O_CREAT
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == 22:  # EINVAL: the filesystem has no O_DIRECT (tmpfs, some overlays)
            raise ValueError(
                f"--dir: {os.path.dirname(path) or '.'!r} does not support O_DIRECT "
                f"(tmpfs or an overlay?); point --dir at a real disk"
            ) from exc
        raise


def _run_streams(num_streams: int, stream: Callable[[int], int]) -> tuple[float, int]:
    """Run ``stream(k)`` for k in [0, num_streams) on as many threads; (seconds, commands)."""
    counts = [0] * num_streams
    errors: list[BaseException] = []
    start = threading.Barrier(num_streams + 1)

    def body(k: int) -> None:
        start.wait()
        try:
            counts[k] = stream(k)
        except BaseException as exc:  # re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(num_streams)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds, sum(counts)


def write_sequential(path: str, num_bytes: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                     in_flight: int = 8, seed: int = 0) -> Throughput:
    """Create ``path`` (pre-allocated) and fill it with random bytes, O_DIRECT, then fsync.

    ``num_bytes`` is rounded up to whole chunks. The timing covers the writes and the
    final ``fsync``, not the allocation.
    """
    if chunk_bytes <= 0 or chunk_bytes % ALIGN:
        raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, got {chunk_bytes}")
    num_chunks = max(1, -(-num_bytes // chunk_bytes))
    total = num_chunks * chunk_bytes
    fd = open_direct(path, write=True, create=True)
    try:
        os.ftruncate(fd, 0)
        os.posix_fallocate(fd, 0, total)
        rng = random.Random(seed)
        buffers = [aligned_buffer(chunk_bytes) for _ in range(in_flight)]
        for buf in buffers:
            buf[:] = rng.randbytes(chunk_bytes)

        def stream(k: int) -> int:
            n = 0
            for i in range(k, num_chunks, in_flight):
                # Stamp the chunk index so no two chunks are byte-identical.
                buffers[k][:8] = i.to_bytes(8, "little")
                done = os.pwritev(fd, [buffers[k]], i * chunk_bytes)
                if done != chunk_bytes:
                    raise OSError(f"short write at chunk {i} of {path}: {done} bytes")
                n += 1
            return n

        seconds, commands = _run_streams(min(in_flight, num_chunks), stream)
        t0 = time.perf_counter()
        os.fsync(fd)
        seconds += time.perf_counter() - t0
    finally:
        os.close(fd)
    return Throughput(total, seconds, commands)


def read_sequential(path: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    in_flight: int = DEFAULT_IN_FLIGHT, num_bytes: int | None = None,
                    destination: Callable[[int], Sequence[memoryview]] | None = None
                    ) -> Throughput:
    """Read ``path`` front to back with O_DIRECT, ``in_flight`` commands outstanding.

    Each command reads into its stream's own buffer, or, with ``destination``, into the
    iovecs ``destination(i)`` gives for chunk ``i`` (``chunk_bytes`` in all; the
    paged-KV ceiling, ``bench.paged_ceiling``)."""
    size = os.path.getsize(path) if num_bytes is None else num_bytes
    num_chunks = size // chunk_bytes
    if num_chunks == 0:
        raise ValueError(f"{path} holds {size} bytes, less than one {chunk_bytes}-byte chunk")
    streams = min(in_flight, num_chunks)
    buffers = ([aligned_buffer(chunk_bytes) for _ in range(streams)] if destination is None
               else [])
    fd = open_direct(path)
    try:
        def stream(k: int) -> int:
            n = 0
            for i in range(k, num_chunks, streams):
                iov = [buffers[k]] if destination is None else destination(i)
                done = os.preadv(fd, iov, i * chunk_bytes)
                if done != chunk_bytes:
                    raise OSError(f"short read at chunk {i} of {path}: {done} bytes")
                n += 1
            return n

        seconds, commands = _run_streams(streams, stream)
    finally:
        os.close(fd)
    return Throughput(num_chunks * chunk_bytes, seconds, commands)


def read_random(path: str, *, op_bytes: int, num_ops: int, in_flight: int = DEFAULT_IN_FLIGHT,
                seed: int = 0) -> Throughput:
    """``num_ops`` O_DIRECT reads of ``op_bytes`` at random aligned offsets of ``path``."""
    if op_bytes <= 0 or op_bytes % ALIGN:
        raise ValueError(f"op_bytes must be a positive multiple of {ALIGN}, got {op_bytes}")
    slots = os.path.getsize(path) // op_bytes
    if slots == 0 or num_ops <= 0:
        raise ValueError(f"read_random: {path} too small for {op_bytes}-byte reads "
                         f"or num_ops={num_ops} <= 0")
    rng = random.Random(seed)
    offsets = [rng.randrange(slots) * op_bytes for _ in range(num_ops)]
    streams = min(in_flight, num_ops)
    buffers = [aligned_buffer(op_bytes) for _ in range(streams)]
    fd = open_direct(path)
    try:
        def stream(k: int) -> int:
            for off in offsets[k::streams]:
                if os.preadv(fd, [buffers[k]], off) != op_bytes:
                    raise OSError(f"short read at offset {off} of {path}")
            return len(offsets[k::streams])

        seconds, commands = _run_streams(streams, stream)
    finally:
        os.close(fd)
    return Throughput(num_ops * op_bytes, seconds, commands)


def fio_available() -> bool:
    return shutil.which("fio") is not None


def run_fio(path: str, *, rw: str, block_bytes: int, iodepth: int = 32,
            size_bytes: int | None = None, runtime_s: float | None = None,
            timeout_s: float = 120.0) -> FioResult | None:
    """fio's bandwidth for one libaio O_DIRECT job on ``path``; None without fio.

    ``size_bytes`` limits the job to the first bytes of the file (default: all of it);
    ``runtime_s`` makes it time based instead (for random reads).
    """
    if rw not in ("read", "write", "randread"):
        raise ValueError(f"fio rw must be read, write or randread, got {rw!r}")
    exe = shutil.which("fio")
    if exe is None:
        return None
    size = os.path.getsize(path) if size_bytes is None else size_bytes
    cmd = [
        exe, f"--name=flatcake-{rw}", f"--filename={path}", f"--rw={rw}",
        f"--bs={block_bytes}", f"--iodepth={iodepth}", "--ioengine=libaio", "--direct=1",
        f"--size={size}", "--output-format=json", "--group_reporting",
    ]
    if rw == "write":
        cmd.append("--end_fsync=1")
    if runtime_s is not None:
        cmd += ["--time_based", f"--runtime={runtime_s}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        logger.warning("fio %s on %s timed out after %.0f s", rw, path, timeout_s)
        return None
    if proc.returncode != 0:
        logger.warning("fio %s failed (rc %d): %s", rw, proc.returncode, proc.stderr.strip())
        return None
    # fio may print warnings before the JSON document.
    text = proc.stdout[proc.stdout.find("{"):]
    job = json.loads(text)["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    return FioResult(rw=rw, block_bytes=block_bytes, iodepth=iodepth,
                     gbps=side["bw_bytes"] / 1e9, iops=float(side["iops"]))
