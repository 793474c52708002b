"""``flatcake bench``: one run that restores the same request from every layout on the
disk under ``--dir`` and compares each with the device ceiling.

Order of a run::

    prepare   make the request's KV (one session, context_tokens, num_turns turns)
              device file   <- sequential O_DIRECT write        (device seq write)
              fio           <- read / write / randread on it    (when fio is installed)
              flatcake      <- the store writes the turns      (write path, timed)
              rounds - 1 more pairs of device write and turn writes, to
              throw-away files (``write_rounds``; medians compared)
              scattered     <- eviction-order bucket files
              per-chunk     <- one file per chunk
    rounds    for each round, every layout in a rotated order:
                  restore into the paged KV, at slots no earlier
                  restore used for the same block              (timed)
                  compare every restored block with its source (untimed)
    control   lookup + plan of the restored request, and of a 219K-token request
    report    medians over rounds; bars; files removed unless --keep

Interleaving the layouts round by round means a noisy neighbour on a shared disk
slows all of them alike, so the ratios stay meaningful when the absolute figures drift.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flatcake import progress
from flatcake.bench import device as dev
from flatcake.bench import write_rounds as wr
from flatcake.bench.control_cost import control_plane_at_scale
from flatcake.bench.flatcake_side import FlatcakeSide
from flatcake.bench.layouts import ScatteredConfig, write_per_chunk_files, write_scattered
from flatcake.bench.paged_ceiling import paged_chunk_bytes, paged_destination
from flatcake.bench.program import ProgramRun, RestoreProgram, run_program, verify_restore
from flatcake.bench.report import (
    BenchReport,
    ControlPlaneCost,
    DeviceFigures,
    WritePath,
)
from flatcake.bench.rows import bench_bars, by_name, layout_rows
from flatcake.bench.source import empty_kv, make_kv, shifted_table, shuffled_slots
from flatcake.cio.direct import probe_direct_io
from flatcake.cio.hugepages import huge_pages_note
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader
from flatcake.geometry import preset
from flatcake.layout import align_up

logger = logging.getLogger(__name__)

LAYOUTS = ("device", "device-paged", "flatcake", "scattered", "per-chunk-files")
FIO_RUNTIME_S = 3.0


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What to measure.

    Attributes:
        directory: where the files go (the disk under test); a fresh sub-directory is
            made inside and removed at the end unless ``keep_files``.
        model: geometry preset (``geometry.PRESETS``).
        context_tokens: tokens of the restored session's history.
        num_turns: turns the history was written in (appended segments).
        rounds: restores per layout; figures are medians over rounds.
        chunk_tokens: tokens per file of ``per-chunk-files`` (LMCache default 256).
        scattered_sessions: sessions interleaved in the eviction-order tier.
        read_threads: threads of the one ``DirectReader`` type every layout uses
            (FlatCake's store gets the same number).
        device_in_flight: commands outstanding in the device-ceiling runs.
        scale_tokens: request size of the control-plane-at-scale check (0: skip).
        use_fio: run fio when it is installed.
        keep_files: leave the files for inspection.
        seed: seeds every random choice.
    """

    directory: str
    model: str = "llama-3.1-8b"
    context_tokens: int = 8192
    num_turns: int = 4
    rounds: int = 3
    chunk_tokens: int = 256
    scattered_sessions: int = 3
    read_threads: int = 16
    device_in_flight: int = 16
    scale_tokens: int = 219_000
    use_fio: bool = True
    keep_files: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("context_tokens", self.context_tokens, 1),
            ("turns", self.num_turns, 1),
            ("rounds", self.rounds, 1),
            ("chunk_tokens", self.chunk_tokens, 1),
            ("scattered_sessions", self.scattered_sessions, 1),
            ("read_threads", self.read_threads, 1),
            ("device_in_flight", self.device_in_flight, 1),
            ("scale_tokens", self.scale_tokens, 0),
        )
        for name, value, low in checks:
            if not isinstance(value, int) or value < low:
                raise ValueError(f"--{name.replace('_', '-')} must be an int >= {low}, "
                                 f"got {value!r}")


def _check_space(directory: str, need_bytes: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < need_bytes * 1.1:
        raise ValueError(f"--dir {directory!r} has {free >> 20} MiB free; this run needs "
                         f"about {need_bytes >> 20} MiB (lower --context-tokens or "
                         f"--scattered-sessions)")


def run_bench(options: BenchOptions, command: str = "flatcake bench") -> BenchReport:
    """Run the whole bench (see the module docstring) and return its report."""
    t_start = time.perf_counter()
    _steady_malloc()
    geometry = preset(options.model)
    tpb = geometry.tokens_per_block
    num_blocks = options.context_tokens // tpb
    if num_blocks < options.num_turns:
        raise ValueError(f"--context-tokens {options.context_tokens} holds {num_blocks} blocks "
                         f"of {tpb} tokens, fewer than --turns {options.num_turns}")
    useful = num_blocks * geometry.block_bytes
    os.makedirs(options.directory, exist_ok=True)
    probe = probe_direct_io(options.directory)
    if not probe.supported:
        raise ValueError(f"--dir {options.directory!r} ({probe.fs_type}) does not support "
                         f"O_DIRECT ({probe.reason}); the bench measures direct reads only")
    # device file, store, per-chunk files, scattered sessions, one write round's two
    _check_space(options.directory, useful * (options.scattered_sessions + 5))
    root = os.path.join(options.directory, f"flatcake-bench-{os.getpid()}")
    os.makedirs(root, mode=0o700)
    notes: list[str] = []
    load_start = os.getloadavg()[0]
    try:
        report = _run(options, command, geometry.name, root, num_blocks, notes, t_start)
        # Other work on the machine slows every layout; the ratios are what to read.
        load_note = (f"1-minute load average {load_start:.2f} at start, "
                     f"{os.getloadavg()[0]:.2f} at end, on {os.cpu_count()} CPUs")
        return dataclasses.replace(report, notes=(*report.notes, load_note))
    finally:
        if options.keep_files:
            logger.info("files kept under %s", root)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run(options: BenchOptions, command: str, model: str, root: str, num_blocks: int,
         notes: list[str], t_start: float) -> BenchReport:
    geometry = preset(model)
    num_layers, sizes = geometry.num_layers, geometry.layer_block_bytes
    useful = num_blocks * geometry.block_bytes
    # Steps: KV, device, fio, three layouts written, every restore, the control plane.
    bar = progress.task("bench", 7 + options.rounds * len(LAYOUTS), "step")
    logger.info("%.1f s: making %d MiB of KV", time.perf_counter() - t_start, useful >> 20)
    source = make_kv(num_layers, num_blocks, sizes, seed=options.seed)
    bar.update()

    # -- device ceiling (file of the request's size) ----------------------------------
    chunk = dev.DEFAULT_CHUNK_BYTES
    device_path = os.path.join(root, "device.bin")
    device_bytes = max(chunk, useful // chunk * chunk)
    seq_write = dev.write_sequential(device_path, device_bytes, chunk_bytes=chunk,
                                     in_flight=options.device_in_flight, seed=options.seed)
    rand_op = align_up(max(sizes))  # the scattered layout's largest command
    rand = dev.read_random(device_path, op_bytes=rand_op,
                           num_ops=min(num_blocks * num_layers, 5_000),
                           in_flight=options.device_in_flight, seed=options.seed)
    logger.info("%.1f s: device write %.3f GB/s, random %d B reads %.3f GB/s",
                time.perf_counter() - t_start, seq_write.gbps, rand_op, rand.gbps)
    bar.update()
    fio: dict[str, dict[str, float]] = {}
    if options.use_fio and dev.fio_available():
        for rw, bs in (("write", chunk), ("read", chunk), ("randread", rand_op)):
            res = dev.run_fio(device_path, rw=rw, block_bytes=bs, iodepth=32,
                              runtime_s=FIO_RUNTIME_S)
            if res is not None:
                fio[rw] = {"gbps": res.gbps, "iops": res.iops, "block_bytes": float(bs),
                           "iodepth": float(res.iodepth)}
    elif options.use_fio:
        notes.append("fio is not installed (apt-get install fio; make fio runs the same jobs): "
                     "device figures are in-process only")

    logger.info("%.1f s: fio %s", time.perf_counter() - t_start, fio)
    bar.update()
    # -- write every layout -----------------------------------------------------------
    reader = DirectReader(options.read_threads)
    fc = FlatcakeSide(os.path.join(root, "store"), geometry, source,
                      num_turns=options.num_turns, read_threads=options.read_threads,
                      seed=options.seed)
    try:
        written_bytes, write_s, write_cpu_s = wr.timed_turn_writes(fc, _cpu_s)
        more = wr.extra_rounds(root, geometry, source, rounds=options.rounds,
                               num_turns=options.num_turns, device_bytes=device_bytes,
                               chunk_bytes=chunk, in_flight=options.device_in_flight,
                               seed=options.seed, cpu_s=_cpu_s)
        writes = [wr.WriteSample(seq_write.gbps, written_bytes, write_s, write_cpu_s), *more]
        logger.info("%.1f s: flatcake wrote %d MiB in %.2f s", time.perf_counter() - t_start,
                    written_bytes >> 20, write_s)
        bar.update()
        scattered = write_scattered(
            os.path.join(root, "scattered"), source,
            ScatteredConfig(num_sessions=options.scattered_sessions, seed=options.seed))
        logger.info("%.1f s: scattered written (%d MiB)", time.perf_counter() - t_start,
                    scattered.files_bytes >> 20)
        bar.update()
        blocks_per_chunk = max(1, options.chunk_tokens // geometry.tokens_per_block)
        chunks = write_per_chunk_files(os.path.join(root, "chunks"), source,
                                       blocks_per_chunk=blocks_per_chunk)

        logger.info("%.1f s: per-chunk files written (%d MiB)", time.perf_counter() - t_start,
                    chunks.files_bytes >> 20)
        bar.update()
        # -- rounds -------------------------------------------------------------------
        # More slots than restores keeps every restore's shift (below) distinct.
        num_slots = max(num_blocks + num_blocks // 4 + 1, 3 * options.rounds + 1)
        dest = empty_kv(num_layers, num_slots, sizes)
        paged = PagedKV(dest, sizes)
        base_table = shuffled_slots(num_blocks, num_slots, seed=options.seed + 1)
        # Each restore shifts the table (source.shifted_table): leftovers of earlier
        # restores can never pass for this one's bytes, so nothing is zeroed in between.
        restore_index = 0
        runs: dict[str, list[ProgramRun]] = {name: [] for name in LAYOUTS}
        staging: dict[str, int] = {"device": chunk * options.device_in_flight,
                                   "scattered": scattered.max_staging_bytes,
                                   "per-chunk-files": chunks.max_staging_bytes}
        verified = {name: True for name in LAYOUTS}
        cpu: dict[str, list[float]] = {name: [] for name in LAYOUTS}

        def restore_program(program: RestoreProgram
                            ) -> Callable[[torch.Tensor], ProgramRun]:
            return lambda table: run_program(program, reader, paged, table)

        restorers: dict[str, Callable[[torch.Tensor], ProgramRun]] = {
            "flatcake": lambda table: fc.restore(dest, table),
            "scattered": restore_program(scattered),
            "per-chunk-files": restore_program(chunks),
        }
        # One untimed restore per layout first: each one's own temporaries (a baseline's
        # strided-copy buffers, FlatCake's staging slots) are faulted in before the
        # clock, whatever ran before it (see _steady_malloc).
        for restore in restorers.values():
            restore(shifted_table(base_table, restore_index, num_slots))
            restore_index += 1
        paged_chunk = paged_chunk_bytes(paged, chunk)
        into_paged, why = paged_destination(reader, paged, base_table, paged_chunk,
                                            device_bytes // max(paged_chunk, 1))
        names = LAYOUTS if into_paged else tuple(n for n in LAYOUTS if n != "device-paged")
        if why:
            notes.append(f"device-paged not run: {why}")
            bar.update(options.rounds)
        for rnd in range(options.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                if name in ("device", "device-paged"):
                    cpu0 = _cpu_s()
                    paged_row = name == "device-paged"
                    t = dev.read_sequential(
                        device_path, chunk_bytes=paged_chunk if paged_row else chunk,
                        in_flight=options.device_in_flight,
                        destination=into_paged if paged_row else None)
                    cpu[name].append(_cpu_s() - cpu0)
                    runs[name].append(ProgramRun(t.seconds, t.num_commands, t.num_bytes))
                    bar.update()
                    continue
                table = shifted_table(base_table, restore_index, num_slots)
                restore_index += 1
                cpu0 = _cpu_s()
                runs[name].append(restorers[name](table))
                cpu[name].append(_cpu_s() - cpu0)
                bad = verify_restore(dest, source, table, geometry.layer_window_blocks)
                if bad:
                    verified[name] = False
                    notes.append(f"{name} round {rnd}: {bad} (block, layer) pairs differ "
                                 f"from what was written")
                logger.info("%.1f s: round %d %s restored in %.3f s",
                            time.perf_counter() - t_start, rnd, name, runs[name][-1].seconds)
                bar.update()
        staging["flatcake"] = fc.staging_bytes()

        # -- control plane ------------------------------------------------------------
        cp_ms = fc.lookup_and_plan_ms(repeats=5)
        bar.update()
    finally:
        bar.close()
        fc.close()
        reader.close()
    read_paths = fc.read_paths

    # What the engine needs of the request: a windowed layer's last window only.
    layouts = layout_rows(names, runs, cpu, staging, verified,
                          geometry.restore_bytes(num_blocks))
    fc_row = by_name(layouts, "flatcake")
    controls = [ControlPlaneCost(options.context_tokens, num_blocks, options.num_turns,
                                 cp_ms, fc_row.restore_s, False,
                                 cp_ms / 1000 / fc_row.restore_s)]
    if options.scale_tokens:
        scale_turns = max(options.num_turns, 8)
        ms, blocks, _ = control_plane_at_scale(geometry, options.scale_tokens, scale_turns,
                                               seed=options.seed)
        est = geometry.kv_bytes(blocks * geometry.tokens_per_block) / (fc_row.gbps * 1e9)
        controls.append(ControlPlaneCost(options.scale_tokens, blocks, scale_turns, ms, est,
                                         True, ms / 1000 / est))
    w = wr.medians(writes)
    write = WritePath(w.flatcake_bytes, w.flatcake_s, w.flatcake_gbps, w.device_gbps,
                      w.flatcake_gbps / w.device_gbps, w.flatcake_cpu_s)
    device = DeviceFigures(
        seq_read_gbps=by_name(layouts, "device").gbps,
        seq_write_gbps=w.device_gbps, chunk_bytes=chunk, in_flight=options.device_in_flight,
        rand_read_gbps=rand.gbps, rand_read_iops=rand.iops, rand_op_bytes=rand_op, fio=fio)
    bars = bench_bars(layouts, controls, num_layers, options.num_turns, write)
    # The scattered layout cannot beat the device's random reads of its command size,
    # whatever reader issues them; say how FlatCake compares with that ceiling too, so a
    # slow reader does not flatter FlatCake.
    rand_best = max(rand.gbps, fio.get("randread", {}).get("gbps", 0.0))
    notes.append(huge_pages_note())
    notes.append("flatcake restore path: " + ", ".join(sorted(read_paths)))
    notes.append(f"flatcake write path: {fc.write_path}")
    if "device-paged" in names:
        dp, fcr = by_name(layouts, "device-paged"), by_name(layouts, "flatcake")
        notes.append(
            f"device-paged: the device's own reads with the paged KV's slots as destination "
            f"({dp.ratio_to_device:.2f} of device): flatcake restores at "
            f"{fcr.gbps / dp.gbps if dp.gbps else 0.0:.2f} of it")
    notes.append(wr.rounds_note(writes))
    notes.append(
        f"scattered's ceiling on this disk: random {rand_op >> 10} KiB reads reach "
        f"{rand_best:.3f} GB/s (best of in-process and fio); scattered restored at "
        f"{by_name(layouts, 'scattered').gbps / rand_best:.2f} of it, flatcake is "
        f"{by_name(layouts, 'flatcake').gbps / rand_best:.2f}x it")
    return BenchReport(
        command=command, directory=os.path.abspath(options.directory), model=model,
        num_layers=num_layers, layer_block_bytes=sizes,
        tokens_per_block=geometry.tokens_per_block, context_tokens=options.context_tokens,
        num_turns=options.num_turns, num_blocks=num_blocks, rounds=options.rounds,
        layouts=tuple(layouts), device=device, control_plane=tuple(controls), write=write,
        bars=tuple(bars), elapsed_s=time.perf_counter() - t_start, notes=tuple(notes))


def _steady_malloc() -> None:
    """Pin glibc's malloc thresholds for this process: blocks up to 32 MiB come from the
    heap and freed heap memory is kept, so a layout's large temporaries reuse pages
    already faulted in instead of depending on what an earlier restore freed (glibc
    raises its mmap threshold dynamically), the same for every layout. (It did not cure
    the per-chunk-files slowdown next to zero-copy restores; see docs/results/history.md.)"""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc: nothing to pin
        return


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h


def _cpu_s() -> float:
    """CPU seconds this process used so far, all threads (user + system), to the
    nanosecond (``CLOCK_PROCESS_CPUTIME_ID``): ``os.times`` counts clock ticks (10 ms),
    about 0.01 ns per byte of a 1 GiB restore, as coarse as the CPU bar's margin."""
    return time.process_time()
