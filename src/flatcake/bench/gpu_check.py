"""Restore paths into GPU memory, next to the device's limit (``scripts/gpu_check.sh``).

On a machine with a GPU this writes one file under ``--dir`` and reads it back three
ways, each timed on its own and byte-checked afterwards (outside the timed region):

- ``device``: O_DIRECT sequential reads into host buffers (the disk's ceiling);
- ``o_direct->pinned->gpu``: O_DIRECT reads into pinned host windows, each copied to
  the GPU with ``cudaMemcpyAsync`` on the window's own stream (a window is reused only
  once its copy is done), so disk reads and host-to-GPU copies overlap;
- ``kvikio->gpu``: kvikio's ``pread`` straight into GPU memory (GPUDirect Storage, or
  kvikio's own bounce buffers in compatibility mode, which is printed).

CUDA and kvikio are imported only when present; without them each GPU path prints
``skipped`` with the reason and the exit status stays 0.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import torch

from flatcake.bench import device as dev
from flatcake.cio.direct import aligned_buffer, writable_view

MIB = 1 << 20


def _gbps(num_bytes: int, seconds: float) -> str:
    return f"{num_bytes / seconds / 1e9:.3f} GB/s" if seconds > 0 else "n/a"


def _file_bytes(path: str) -> torch.Tensor:
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def pinned_to_gpu(path: str, size: int, chunk: int, windows: int) -> tuple[float, Any]:
    """O_DIRECT -> pinned window -> GPU; returns (seconds, the GPU tensor)."""
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    hosts = [aligned_buffer(chunk, pin=True) for _ in range(windows)]
    streams = [torch.cuda.Stream() for _ in range(windows)]
    events = [torch.cuda.Event() for _ in range(windows)]
    fd = dev.open_direct(path)
    errors: list[BaseException] = []

    def window(k: int) -> None:
        try:
            view = writable_view(hosts[k])
            for i in range(k, size // chunk, windows):
                events[k].synchronize()  # the window's previous copy has left it
                if os.preadv(fd, [view], i * chunk) != chunk:
                    raise OSError(f"short read at chunk {i} of {path}")
                with torch.cuda.stream(streams[k]):
                    gpu[i * chunk:(i + 1) * chunk].copy_(hosts[k], non_blocking=True)
                    events[k].record(streams[k])
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    try:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=window, args=(k,)) for k in range(windows)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return seconds, gpu


def kvikio_to_gpu(path: str, size: int) -> tuple[float, Any, str]:
    """kvikio pread into GPU memory; returns (seconds, the GPU tensor, its mode)."""
    import kvikio

    defaults: Any = getattr(kvikio, "defaults", None)
    compat = getattr(defaults, "compat_mode", None) or getattr(
        defaults, "is_compat_mode_preferred", None)
    mode = f"compat mode {compat()}" if callable(compat) else "mode unknown"
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    handle = kvikio.CuFile(path, "r")
    try:
        t0 = time.perf_counter()
        n = handle.pread(gpu, size, 0).get()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        handle.close()
    if n != size:
        raise OSError(f"kvikio read {n} of {size} bytes")
    return seconds, gpu, mode


def run_check(directory: str, size_mib: int, chunk_mib: int = 4, windows: int = 8
              ) -> list[str]:
    """The report lines (see the module docstring)."""
    if size_mib < chunk_mib or size_mib % chunk_mib or chunk_mib < 1 or windows < 1:
        raise ValueError(f"--size-mib must be a positive multiple of --chunk-mib, got "
                         f"{size_mib} and {chunk_mib}; --windows must be >= 1")
    size, chunk = size_mib * MIB, chunk_mib * MIB
    path = os.path.join(directory, "flatcake-gpu-check.bin")
    lines = []
    try:
        dev.write_sequential(path, size, chunk_bytes=chunk)
        ceiling = dev.read_sequential(path, chunk_bytes=chunk, in_flight=windows)
        lines.append(f"device: O_DIRECT sequential read {ceiling.gbps:.3f} GB/s "
                     f"({size_mib} MiB, {chunk_mib} MiB x {windows} in flight)")
        if not torch.cuda.is_available():
            reason = "skipped (no CUDA device)"
            return [*lines, f"o_direct->pinned->gpu: {reason}", f"kvikio->gpu: {reason}"]
        expect = _file_bytes(path)
        seconds, gpu = pinned_to_gpu(path, size, chunk, windows)
        ok = torch.equal(gpu.cpu(), expect)
        lines.append(f"o_direct->pinned->gpu: {_gbps(size, seconds)} = "
                     f"{size / seconds / 1e9 / ceiling.gbps:.2f} x device; bytes "
                     f"{'equal' if ok else 'DIFFER'}")
        try:
            import kvikio  # noqa: F401
        except ImportError:
            return [*lines, "kvikio->gpu: skipped (kvikio is not installed)"]
        seconds, gpu, mode = kvikio_to_gpu(path, size)
        ok = torch.equal(gpu.cpu(), expect)
        lines.append(f"kvikio->gpu: {_gbps(size, seconds)} = "
                     f"{size / seconds / 1e9 / ceiling.gbps:.2f} x device ({mode}); bytes "
                     f"{'equal' if ok else 'DIFFER'}")
        return lines
    finally:
        if os.path.exists(path):
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=".", help="directory on the disk to test")
    p.add_argument("--size-mib", type=int, default=1024, help="file size (default 1024)")
    p.add_argument("--chunk-mib", type=int, default=4, help="read size (default 4)")
    p.add_argument("--windows", type=int, default=8, help="reads in flight (default 8)")
    args = p.parse_args(argv)
    try:
        lines = run_check(args.dir, args.size_mib, args.chunk_mib, args.windows)
    except (ValueError, OSError) as exc:
        p.exit(2, f"gpu_check: error: {exc}\n")
    print("\n".join(lines))
    return 1 if any("DIFFER" in line for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
