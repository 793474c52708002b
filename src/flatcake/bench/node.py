"""``flatcake bench --node``: the node service's rows, measured against one
``flatcake serve`` started on the disk under ``--dir``.

Order of a run::

    serve     flatcake serve on a fresh root (a child process; SIGTERM at the end)
    write     SESSIONS sessions of BLOCKS blocks, each one SSD turn, through an attached
              FlatCakeStore
    restore   each round, alternated: 1 attached process restores every session, then
              CLIENTS attached processes restore their share at once (spawned, started
              together at a barrier); GB/s = bytes restored / (last end - first start);
              CPU ns/B of the clients; every restored byte compared after the clock
    calls     the scheduler half's CPU per call (what the engine's scheduler thread pays),
              embedded (today's in-process half) and through the service, alternated: a
              lookup of a LOOKUP_BLOCKS-block prompt (a miss) and a step with nothing to
              load
    report    medians over rounds; bars; files removed unless --keep

Interleaving keeps the ratios meaningful on a noisy machine; the load average is noted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing as mp
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flatcake.bench.control_cost import session_keys
from flatcake.bench.report import Bar, footer, median
from flatcake.bench.source import empty_kv, make_kv
from flatcake.config import FlatCakeConfig, load_config
from flatcake.geometry import KVGeometry, preset


@dataclass(frozen=True, slots=True)
class NodeBenchOptions:
    """What ``--node`` measures (``directory``: the disk under test, as the bench's)."""

    directory: str
    model: str = "llama-3.1-8b"
    clients: int = 4
    sessions: int = 8
    blocks: int = 64
    rounds: int = 2
    calls: int = 300
    lookup_blocks: int = 2048
    keep_files: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("clients", "sessions", "blocks", "rounds", "calls", "lookup_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an int >= 1, "
                                 f"got {value!r}")
        if self.sessions < self.clients:
            raise ValueError(f"--sessions {self.sessions} is fewer than --clients "
                             f"{self.clients}: each client restores at least one session")


@dataclass(frozen=True, slots=True)
class RestoreRow:
    """Restores of every session by ``processes`` attached processes at once."""

    processes: int
    gbps: float  # median over rounds
    gbps_runs: tuple[float, ...]
    cpu_ns_per_byte: float  # median: the clients' CPU over the bytes they restored
    bytes_restored: int
    verified: bool


@dataclass(frozen=True, slots=True)
class CallCost:
    """One scheduler-half call, per call (medians over rounds)."""

    call: str
    half: str  # "embedded" or "node service"
    cpu_us: float
    wall_us: float


@dataclass(frozen=True, slots=True)
class NodeBenchReport:
    command: str
    model: str
    sessions: int
    blocks: int
    session_bytes: int
    rounds: int
    calls: int
    restores: tuple[RestoreRow, ...]
    costs: tuple[CallCost, ...]
    bars: tuple[Bar, ...]
    elapsed_s: float
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["bars"] = [dict(dataclasses.asdict(b), passed=b.passed) for b in self.bars]
        return doc


def run_node_bench(options: NodeBenchOptions, command: str = "flatcake bench --node"
                   ) -> NodeBenchReport:
    """Run the node rows (see the module docstring) and return their report."""
    t_start = time.perf_counter()
    geometry = preset(options.model)
    os.makedirs(options.directory, exist_ok=True)
    work = Path(options.directory).absolute() / f"flatcake-node-bench-{os.getpid()}"
    work.mkdir(mode=0o700)
    load_start = os.getloadavg()[0]
    try:
        settings = ("store.memory_capacity_bytes=0", "placement.memory_copy_watermark=0",
                    f"store.ssd_capacity_bytes={max(1 << 30, 2 * _total_bytes(options))}")
        with served(work / "root", *settings) as (sock, _pid):
            _write_sessions(sock, geometry, options)
            restores = _restore_rows(sock, options)
            costs = _call_costs(sock, geometry, options, work / "embedded")
    finally:
        if not options.keep_files:
            shutil.rmtree(work, ignore_errors=True)
    one, many = restores
    cost = {(c.call, c.half): c for c in costs}
    lookup = f"lookup of {options.lookup_blocks} blocks"
    bars = (
        Bar(f"restore GB/s, {options.clients} processes / 1 process",
            many.gbps / one.gbps if one.gbps else 0.0, ">=", 0.9),
        Bar(f"{lookup} through the service, CPU us", cost[(lookup, "node service")].cpu_us,
            "<=", 1000.0),
        Bar("step with nothing to load through the service, CPU us",
            cost[("empty step", "node service")].cpu_us, "<=", 50.0),
        Bar("every restored byte equal", float(one.verified and many.verified), ">=", 1.0),
    )
    notes = ("the lookup is a miss (its keys are not stored): the scheduler half's "
             "own cost of one call, not the books' work on a hit",
             f"1-minute load average {load_start:.2f} at start, {os.getloadavg()[0]:.2f} "
             f"at end, on {os.cpu_count()} CPUs")
    return NodeBenchReport(
        command=command, model=options.model, sessions=options.sessions,
        blocks=options.blocks, session_bytes=_total_bytes(options) // options.sessions,
        rounds=options.rounds, calls=options.calls, restores=restores, costs=tuple(costs),
        bars=bars, elapsed_s=time.perf_counter() - t_start, notes=notes)


def _total_bytes(options: NodeBenchOptions) -> int:
    g = preset(options.model)
    return options.sessions * options.blocks * g.block_bytes


# -- the service --------------------------------------------------------------------


@contextlib.contextmanager
def served(root: Path, *settings: str, start_s: float = 60.0) -> Iterator[tuple[Path, int]]:
    """``flatcake serve`` on ``root`` in a child process (socket, arena and log beside
    the root); yields its socket and process id; SIGTERM at the end."""
    sock, shm, log = root.parent / "node.sock", root.parent / "shm", root.parent / "serve.log"
    shm.mkdir(exist_ok=True)
    sets = [*settings, f"store.node_arena_dir={shm}"]
    cmd = [sys.executable, "-m", "flatcake.cli", "serve", "--root", str(root), "--socket",
           str(sock), *[x for kv in sets for x in ("--set", kv)]]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + start_s
        line = ""
        while not line.startswith("ready") and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                if not line:
                    break
        if not line.startswith("ready"):
            raise RuntimeError(f"flatcake serve did not start: {line.strip()} "
                               f"{log.read_text()[-2000:]}")
        yield sock, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def attached_config(sock: Path) -> FlatCakeConfig:
    return load_config(env={}, overrides=[f"store.node=unix:{sock}",
                                          "store.node_timeout_s=30"])


def _session(geometry: KVGeometry, options: NodeBenchOptions, s: int
             ) -> tuple[list[bytes], list[torch.Tensor]]:
    """Session ``s``'s keys and KV (``blocks`` layout, block ``i`` in slot ``i``)."""
    seed = options.seed + 1000 * s
    return (session_keys(geometry, options.blocks, seed=seed),
            make_kv(geometry.num_layers, options.blocks, geometry.layer_block_bytes,
                    seed=seed))


def _write_sessions(sock: Path, geometry: KVGeometry, options: NodeBenchOptions) -> None:
    from flatcake.store import FlatCakeStore, TurnSignals

    store = FlatCakeStore.open(sock.parent / "root", geometry, attached_config(sock))
    try:
        for s in range(options.sessions):
            keys, kv = _session(geometry, options, s)
            res = store.store_turn(f"bench-{s}", keys, kv, list(range(options.blocks)),
                                   TurnSignals(turn_index=0, context_tokens=10**6))
            if res.num_blocks != options.blocks or res.medium is None:
                raise RuntimeError(f"session {s}: {res.num_blocks} of {options.blocks} "
                                   f"blocks stored ({res.error or 'no error given'})")
    finally:
        store.close()


# -- restores -----------------------------------------------------------------------


def _restore_client(sock: str, model: str, options: NodeBenchOptions, sessions: list[int],
                    start: Any, out: Any) -> None:
    """One attached process (spawned): restore ``sessions`` into KV of its own once
    every client is ready, then compare every byte (after the clock)."""
    from flatcake.store import FlatCakeStore

    geometry = preset(model)
    try:
        store = FlatCakeStore.open(Path(sock).parent / "root", geometry,
                                   attached_config(Path(sock)))
    except Exception as exc:
        start.abort()
        out.put(f"attach failed: {exc}")
        return
    try:
        keys = {s: session_keys(geometry, options.blocks, seed=options.seed + 1000 * s)
                for s in sessions}
        dest = {s: empty_kv(geometry.num_layers, options.blocks,
                            geometry.layer_block_bytes) for s in sessions}
        slots = list(range(options.blocks))
        start.wait()
        t0, c0 = time.monotonic(), time.process_time()
        loads = [store.load(keys[s], dest[s], slots) for s in sessions]
        t1, cpu = time.monotonic(), time.process_time() - c0
        exact = all(r.num_blocks == options.blocks for r in loads)
        for s in sessions:
            _, kv = _session(geometry, options, s)
            exact &= all(torch.equal(a, b) for a, b in zip(dest[s], kv, strict=True))
        out.put((t0, t1, cpu, sum(r.useful_bytes for r in loads), exact))
    except Exception as exc:
        out.put(f"restore failed: {type(exc).__name__}: {exc}")
    finally:
        store.close()


def _restore_once(sock: Path, options: NodeBenchOptions, groups: list[list[int]]
                  ) -> tuple[float, float, int, bool]:
    """(GB/s, CPU ns/B, bytes, every byte equal) of ``groups``' processes at once."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(groups)), ctx.Queue()
    procs = [ctx.Process(target=_restore_client,
                         args=(str(sock), options.model, options, g, start, out))
             for g in groups]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join(timeout=15)
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"a restoring process failed: {failed[0]}")
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    moved = sum(r[3] for r in results)
    return (moved / wall / 1e9 if wall > 0 else 0.0,
            sum(r[2] for r in results) * 1e9 / max(moved, 1), moved,
            all(r[4] for r in results))


def _restore_rows(sock: Path, options: NodeBenchOptions) -> tuple[RestoreRow, RestoreRow]:
    sessions = list(range(options.sessions))
    shapes = {1: [sessions],
              options.clients: [sessions[i::options.clients] for i in range(options.clients)]}
    runs: dict[int, list[tuple[float, float, int, bool]]] = {n: [] for n in shapes}
    for _ in range(options.rounds):
        for n, groups in shapes.items():
            runs[n].append(_restore_once(sock, options, groups))
    rows = [RestoreRow(n, median([r[0] for r in got]), tuple(r[0] for r in got),
                       median([r[1] for r in got]), got[-1][2], all(r[3] for r in got))
            for n, got in runs.items()]
    return rows[0], rows[-1]


# -- the scheduler half's calls -----------------------------------------------------


def _per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(CPU us, wall us) per call of ``fn`` (one warm-up call first)."""
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return ((time.process_time() - c0) / calls * 1e6,
            (time.perf_counter() - w0) / calls * 1e6)


def _call_costs(sock: Path, geometry: KVGeometry, options: NodeBenchOptions,
                scratch: Path) -> list[CallCost]:
    from flatcake.connectors.node_client import RemoteSchedulerSide
    from flatcake.connectors.requests import RequestView
    from flatcake.connectors.scheduler_side import SchedulerSide

    n = options.lookup_blocks
    keys = tuple(session_keys(geometry, n, seed=options.seed + 7))
    tokens = n * geometry.tokens_per_block + 1
    req = RequestView("bench-lookup", keys, tokens, tokens)
    halves: dict[str, Any] = {
        "embedded": SchedulerSide(geometry, load_config(
            env={}, overrides=["store.memory_capacity_bytes=0"]), scratch),
        "node service": RemoteSchedulerSide(geometry, attached_config(sock)),
    }
    lookup = f"lookup of {n} blocks"
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(options.rounds):
            for half, side in halves.items():
                got.setdefault((lookup, half), []).append(_per_call(
                    functools.partial(side.num_matched_tokens, req, 0), options.calls))
                got.setdefault(("empty step", half), []).append(_per_call(
                    side.build_step, options.calls * 10))
    finally:
        for side in halves.values():
            side.close()
    return [CallCost(call, half, median([c for c, _ in v]), median([w for _, w in v]))
            for (call, half), v in got.items()]


# -- the report ---------------------------------------------------------------------


def format_node_table(report: NodeBenchReport) -> str:
    """The human-readable report of ``--node``."""
    lines = [
        f"flatcake bench --node: {report.model}, {report.sessions} sessions x "
        f"{report.blocks} blocks ({report.session_bytes / 2**20:.1f} MiB each) on SSD, "
        f"{report.rounds} rounds (median), one node service",
        f"command: {report.command}", "",
        f"{'restore':<22} {'gbps':>7} {'runs':>20} {'cpu_ns/B':>9} {'bytes':>14} "
        f"{'verified':>8}",
    ]
    for r in report.restores:
        runs = "/".join(f"{g:.3f}" for g in r.gbps_runs)
        lines.append(f"{f'{r.processes} attached process' + ('es' if r.processes > 1 else ''):<22}"
                     f" {r.gbps:>7.3f} {runs:>20} {r.cpu_ns_per_byte:>9.2f} "
                     f"{r.bytes_restored:>14} {'yes' if r.verified else 'NO':>8}")
    lines += ["", f"{'scheduler-half call':<24} {'half':<13} {'cpu_us':>9} {'wall_us':>9}"]
    for c in report.costs:
        lines.append(f"{c.call:<24} {c.half:<13} {c.cpu_us:>9.2f} {c.wall_us:>9.2f}")
    lines += footer(report.bars, report.notes, report.elapsed_s)
    return "\n".join(lines)


def format_node_markdown(report: NodeBenchReport) -> str:
    """The report as markdown tables (``--docs-out``, under its provenance lines)."""
    lines = [f"{report.model}, {report.sessions} sessions x {report.blocks} blocks "
             f"({report.session_bytes / 2**20:.1f} MiB each) on SSD, {report.rounds} rounds "
             "(median), one node service.", "",
             "| restore | GB/s | runs | CPU ns/B | bytes | every byte equal |",
             "|---|---|---|---|---|---|"]
    for r in report.restores:
        lines.append(f"| {r.processes} attached process{'es' if r.processes > 1 else ''} "
                     f"| {r.gbps:.3f} | {' / '.join(f'{g:.3f}' for g in r.gbps_runs)} "
                     f"| {r.cpu_ns_per_byte:.2f} | {r.bytes_restored} "
                     f"| {'yes' if r.verified else 'NO'} |")
    lines += ["", "| scheduler-half call | half | CPU us | wall us |", "|---|---|---|---|"]
    lines += [f"| {c.call} | {c.half} | {c.cpu_us:.2f} | {c.wall_us:.2f} |"
              for c in report.costs]
    lines += ["", "| bar | value | target | |", "|---|---|---|---|"]
    lines += [f"| {b.name} | {b.value:.3f} | {b.op} {b.threshold:g} | "
              f"{'PASS' if b.passed else 'MISS'} |" for b in report.bars]
    lines += ["", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines)
