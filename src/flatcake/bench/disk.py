"""Measure this machine's SSD for the ``local`` replay preset.

``measure_ssd(directory)`` writes a scratch file with O_DIRECT, then measures with
O_DIRECT reads (no page cache):

* sequential bandwidth: 16 MiB reads over the file, 4 threads in flight;
* command latency: 4 KiB reads at random aligned offsets, one at a time;
* commands in flight that hide it: 4 KiB random reads with ``threads`` in flight; the
  queue depth of the model is the one that makes ``latency / qd`` equal the measured
  time per command.

It returns an ``SsdSpec`` with those figures (the capacity is the caller's budget). The
``local`` preset stores the figures measured on the development machine; rerun
``python -m flatcake.bench.disk DIR`` to see this machine's (DIR is required: the scratch
file is 1 GiB by default, ``--mib`` sets it).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flatcake.replay.node.devices import SsdSpec

MIB = 1024**2


def _aligned(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n)  # anonymous maps are page aligned


def measure_ssd(directory: str | Path, file_bytes: int = 1024 * MIB, threads: int = 8,
                seconds: float = 2.0) -> SsdSpec:
    """Measure sequential read/write bandwidth and command latency under ``directory``."""
    if not hasattr(os, "O_DIRECT"):
        raise ValueError("measure_ssd needs O_DIRECT (Linux)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f".flatcake-calibrate-{os.getpid()}"
    chunk = 16 * MIB
    file_bytes = max(chunk, file_bytes // chunk * chunk)
    buf = _aligned(chunk)
    buf.write(os.urandom(1 << 20) * (chunk >> 20))
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    try:
        t0 = time.perf_counter()
        for off in range(0, file_bytes, chunk):
            os.pwritev(fd, [buf], off)
        os.fsync(fd)
        write_bps = file_bytes / (time.perf_counter() - t0)

        def read_chunk(off: int) -> None:
            b = _aligned(chunk)
            os.preadv(fd, [b], off)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(read_chunk, range(0, file_bytes, chunk)))
        read_bps = file_bytes / (time.perf_counter() - t0)

        rng = random.Random(0)
        pages = file_bytes // 4096
        small = _aligned(4096)
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2:
            os.preadv(fd, [small], rng.randrange(pages) * 4096)
            n += 1
        latency = (time.perf_counter() - t0) / n

        def burst(seed: int) -> int:
            r = random.Random(seed)
            b = _aligned(4096)
            k = 0
            end = time.perf_counter() + seconds / 2
            while time.perf_counter() < end:
                os.preadv(fd, [b], r.randrange(pages) * 4096)
                k += 1
            return k

        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            total = sum(ex.map(burst, range(threads)))
        per_cmd = (time.perf_counter() - t0) / total
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    qd = max(1, round(latency / per_cmd))
    return SsdSpec(capacity_bytes=0, read_bytes_per_s=read_bps, write_bytes_per_s=write_bps,
                   command_latency_s=latency, queue_depth=qd)


def main(argv: list[str]) -> int:
    """``python -m flatcake.bench.disk DIR [--mib N]``: print DIR's drive figures."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m flatcake.bench.disk",
        description="Measure a drive with O_DIRECT for the replay's local preset. Writes a "
                    "scratch file of --mib MiB under DIR and removes it.")
    ap.add_argument("dir", help="a directory on the drive to measure (created if missing)")
    ap.add_argument("--mib", type=int, default=1024, help="scratch file size in MiB (1024)")
    args = ap.parse_args(argv[1:])
    if args.mib < 16:
        ap.error(f"--mib must be at least 16, got {args.mib}")
    try:
        spec = measure_ssd(args.dir, file_bytes=args.mib * MIB)
    except (OSError, ValueError) as e:
        ap.exit(2, f"{ap.prog}: cannot measure under {args.dir}: {e}\n")
    print(f"measured under {args.dir}:")
    for f in dataclasses.fields(spec):
        if f.name != "capacity_bytes":
            print(f"  {f.name} = {getattr(spec, f.name)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
