"""``flatcake bench --connector``: the CPU the connector's scheduler half costs the
engine's scheduler thread, per request and per prompt block, embedded and through the
node service (``flatcake serve``, ``bench.node.served``).

Each request goes through the hooks vLLM calls, in its order, with vLLM's own block
hashes (random 32-byte ones) turned into keys as the connector does
(``connectors.requests.RequestKeys``)::

    new     a prompt nobody holds: lookup (keys, on_new_request,
            get_num_new_matched_tokens: a miss), store (the step computing the prompt
            places and allocates it, ``build_step``'s ``computed``; the workers' report
            of it durable), finish
    held    the same prompt again, every block in vLLM's own prefix cache: lookup
            (nothing to load), store (FlatCake holds it durably: none), finish
    hit     the prompt FlatCake holds, vLLM none of it: lookup, admission
            (update_state_after_alloc and the step handing out the load), the load's
            report, finish
    idle    a step with nothing to do (build_connector_meta)

Books only: no bytes move (the workers' reports are made up), so the figures are the
scheduler half's own cost. CPU is this process's (``time.process_time``); through the
service, the service's CPU per request is read off ``/proc`` beside it. The startup heap
is frozen out of the garbage collector (``gc.freeze``) as vLLM's engine core does. Embedded
and service rounds alternate; medians over rounds; the load average is noted.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.bench.node import attached_config, served
from flatcake.bench.report import Bar, footer, median
from flatcake.config import load_config
from flatcake.connectors.requests import RequestKeys, RequestView
from flatcake.geometry import preset
from flatcake.plan.tasks import LoadDone, StoreDone, WorkerReport

PHASES = ("lookup", "admission", "store", "finish", "step")  # "step": the idle step
# Books of SSD homes only (each new prompt a session of its own), never full.
SETTINGS = ("store.memory_capacity_bytes=0", "placement.memory_copy_watermark=0",
            f"store.ssd_capacity_bytes={1 << 50}")


@dataclass(frozen=True, slots=True)
class ConnectorBenchOptions:
    """What ``--connector`` measures (``directory``: where the books' roots go)."""

    directory: str
    model: str = "llama-3.1-8b"
    blocks: tuple[int, ...] = (64, 256)
    requests: int = 200
    rounds: int = 3
    node: bool = True  # also through ``flatcake serve``
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be an int >= 1, got {value!r}")
        if not self.blocks or any(not isinstance(b, int) or b < 1 for b in self.blocks):
            raise ValueError(f"--prompt-blocks must be ints >= 1, got {self.blocks!r}")


@dataclass(frozen=True, slots=True)
class ConnectorCost:
    """One kind of request (or the idle step) through one half: CPU us per request by
    phase, medians over rounds; ``service_us``: the node service's CPU per request."""

    half: str  # "embedded" or "node service"
    case: str  # "new", "held", "hit" or "idle step"
    blocks: int
    phases: dict[str, float]
    service_us: float = 0.0

    @property
    def total_us(self) -> float:
        return sum(self.phases.values())

    @property
    def per_block_us(self) -> float:
        return self.total_us / self.blocks if self.blocks else 0.0


class Request:
    """What the connector reads off vLLM's ``Request``: its id and block hashes."""

    def __init__(self, request_id: str, block_hashes: list[bytes]) -> None:
        self.request_id = request_id
        self.block_hashes = block_hashes
        self.cache_salt: str | None = None


class Driver:
    """One scheduler half driven through vLLM's hooks, CPU taken by phase."""

    def __init__(self, side: Any, tokens_per_block: int, model: str,
                 prefix: str = "r") -> None:
        self.side = side
        self.prefix = prefix  # request ids: unique per engine on one service, as vLLM's
        self.bs = tokens_per_block
        self.keys = RequestKeys(model, "", 1)
        self.cpu: dict[str, float] = defaultdict(float)
        self._n = 0

    def _timed(self, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
        c0 = time.process_time()
        out = fn(*args)
        self.cpu[phase] += time.process_time() - c0
        return out

    def _view(self, req: Request) -> RequestView:
        n = len(req.block_hashes) * self.bs + self.bs // 2  # a partial last block
        return RequestView(req.request_id, self.keys.keys(req), n, n)

    def request(self, hashes: list[bytes], local_blocks: int) -> None:
        """One request of the prompt ``hashes``; the engine holds ``local_blocks``. The
        hooks vLLM calls back to back are timed together (one clock read each side of
        them); the workers' made-up reports are built outside the clock."""
        self._n += 1
        req, side = Request(f"{self.prefix}{self._n}", hashes), self.side
        ids = list(range(len(hashes)))

        def lookup() -> tuple[int | None, bool]:
            side.new_request(self._view(req))
            out: tuple[int | None, bool] = side.num_matched_tokens(
                self._view(req), local_blocks * self.bs)
            return out

        def admit() -> Any:
            side.after_alloc(req.request_id, ids, n)
            return side.build_step()

        def reported(done: WorkerReport, released: list[str]) -> None:
            side.on_report(done)
            side.take_released(released)
            side.take_events()  # vLLM takes them every step

        n, _ = self._timed("lookup", lookup)
        if n:
            plan = self._timed("admission", admit)
            loaded = n // self.bs + local_blocks
            done = WorkerReport(loads=tuple(LoadDone(t.request_id, loaded, loaded)
                                            for t in plan.loads))
            self._timed("admission", reported, done, [req.request_id])
        plan = self._timed("store", lambda: side.build_step((), [(self._view(req), ids)]))
        if plan.stores:
            done = WorkerReport(stores=tuple(StoreDone(t.request_id, t.plan.segment.segment_id,
                                                       True) for t in plan.stores))
            self._timed("store", reported, done, [])
        self._timed("finish", lambda: side.request_finished(self._view(req)))
        self.keys.forget(req.request_id)


def _hashes(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(32) for _ in range(n)]


def _service_cpu_s(pid: int) -> float:
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(side: Any, options: ConnectorBenchOptions, half: str, pid: int,
             rng: random.Random) -> list[ConnectorCost]:
    geometry = preset(options.model)
    out = []
    for blocks in options.blocks:
        stored = _hashes(rng, blocks)
        for case, local in (("new", 0), ("held", blocks), ("hit", 0)):
            d = Driver(side, geometry.tokens_per_block, geometry.name)
            d.request(stored, 0)  # stores the prompt "held" and "hit" ask for

            def prompt(case: str = case, blocks: int = blocks,
                       stored: list[bytes] = stored) -> list[bytes]:
                return _hashes(rng, blocks) if case == "new" else stored

            d.request(prompt(), local)  # warm
            d.cpu.clear()
            s0 = _service_cpu_s(pid)
            for _ in range(options.requests):
                d.request(prompt(), local)
            n = options.requests
            out.append(ConnectorCost(half, case, blocks,
                                     {p: d.cpu[p] / n * 1e6 for p in PHASES},
                                     (_service_cpu_s(pid) - s0) / n * 1e6))
    steps = options.requests * 20
    c0 = time.process_time()
    for _ in range(steps):
        side.build_step()
    out.append(ConnectorCost(half, "idle step", 0,
                             {"step": (time.process_time() - c0) / steps * 1e6}))
    return out


def run_connector_bench(options: ConnectorBenchOptions,
                        command: str = "flatcake bench --connector") -> ConnectorReport:
    """Run the rows (see the module docstring) and return their report."""
    from flatcake.connectors.node_client import RemoteSchedulerSide
    from flatcake.connectors.scheduler_side import SchedulerSide

    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    geometry = preset(options.model)
    work = Path(options.directory).absolute() / f"flatcake-connector-bench-{os.getpid()}"
    work.mkdir(parents=True, mode=0o700)
    rng = random.Random(options.seed)
    got: dict[tuple[str, str, int], list[ConnectorCost]] = defaultdict(list)
    try:
        with served(work / "root", *SETTINGS) if options.node else _nothing() as (sock, pid):
            for r in range(options.rounds):
                halves: list[tuple[str, Any, int]] = [("embedded", SchedulerSide(
                    geometry, load_config(env={}, overrides=SETTINGS),
                    work / f"embedded-{r}"), 0)]
                if sock is not None:
                    halves.append(("node service", RemoteSchedulerSide(
                        geometry, attached_config(sock)), pid))
                for half, side, side_pid in halves if r % 2 == 0 else halves[::-1]:
                    gc.collect()
                    gc.freeze()  # as vLLM's engine core freezes its startup heap
                    try:
                        for cost in _measure(side, options, half, side_pid, rng):
                            got[(cost.half, cost.case, cost.blocks)].append(cost)
                    finally:
                        side.close()
                        gc.unfreeze()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    costs = tuple(ConnectorCost(half, case, blocks,
                                {p: median([c.phases.get(p, 0.0) for c in runs])
                                 for p in PHASES},
                                median([c.service_us for c in runs]))
                  for (half, case, blocks), runs in got.items())
    return ConnectorReport(command, options.model, geometry.tokens_per_block,
                           options.requests, options.rounds, costs, _bars(costs),
                           (f"1-minute load average {load_start:.2f} at start, "
                            f"{os.getloadavg()[0]:.2f} at end, on {os.cpu_count()} CPUs",),
                           time.perf_counter() - t_start)


class _nothing:
    def __enter__(self) -> tuple[None, int]:
        return None, 0

    def __exit__(self, *exc: object) -> None:
        return None


def _bars(costs: tuple[ConnectorCost, ...]) -> tuple[Bar, ...]:
    by = {(c.half, c.case, c.blocks): c for c in costs}
    bars = []
    for half, limit in (("embedded", 150.0), ("node service", 300.0)):
        new = by.get((half, "new", 64))
        if new is not None:
            bars.append(Bar(f"new request of 64 blocks, {half}, CPU us", new.total_us,
                            "<=", limit))
    idle = by.get(("embedded", "idle step", 0))
    if idle is not None:
        bars.append(Bar("idle step, embedded, CPU us", idle.total_us, "<=", 20.0))
    return tuple(bars)


@dataclass(frozen=True, slots=True)
class ConnectorReport:
    command: str
    model: str
    tokens_per_block: int
    requests: int
    rounds: int
    costs: tuple[ConnectorCost, ...]
    bars: tuple[Bar, ...]
    notes: tuple[str, ...]
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "model": self.model,
                "tokens_per_block": self.tokens_per_block, "requests": self.requests,
                "rounds": self.rounds, "notes": list(self.notes), "elapsed_s": self.elapsed_s,
                "costs": [{"half": c.half, "case": c.case, "blocks": c.blocks,
                           "cpu_us": c.phases, "total_us": c.total_us,
                           "per_block_us": c.per_block_us, "service_us": c.service_us}
                          for c in self.costs],
                "bars": [{"name": b.name, "value": b.value, "op": b.op,
                          "threshold": b.threshold, "passed": b.passed} for b in self.bars]}


def format_connector_rows(report: ConnectorReport, markdown: bool = False) -> list[str]:
    """The cost table: text columns, or a markdown table."""
    head = ["half", "request", "blocks", *[f"{p} us" for p in PHASES], "total us",
            "us/block", "service us"]
    rows = [[c.half, c.case, str(c.blocks), *[f"{c.phases[p]:.1f}" for p in PHASES],
             f"{c.total_us:.1f}", f"{c.per_block_us:.2f}" if c.blocks else "-",
             f"{c.service_us:.1f}" if c.half == "node service" else "-"]
            for c in report.costs]
    if markdown:
        return [f"| {' | '.join(head)} |", "|" + "---|" * len(head),
                *[f"| {' | '.join(r)} |" for r in rows]]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return ["  ".join(x.rjust(w) if i > 1 else x.ljust(w) for i, (x, w) in
                      enumerate(zip(r, widths, strict=True))) for r in [head, *rows]]


def format_connector_table(report: ConnectorReport) -> str:
    lines = [f"flatcake bench --connector: {report.model} ({report.tokens_per_block}-token "
             f"blocks), CPU per request of the scheduler half, {report.requests} requests "
             f"per figure, {report.rounds} rounds (median)", f"command: {report.command}", "",
             *format_connector_rows(report)]
    return "\n".join(lines + footer(report.bars, report.notes, report.elapsed_s))


def format_connector_markdown(report: ConnectorReport) -> str:
    lines = [f"{report.model} ({report.tokens_per_block}-token blocks), CPU per request of "
             f"the scheduler half, {report.requests} requests per figure, {report.rounds} "
             "rounds (median).", "", *format_connector_rows(report, markdown=True), "",
             "| bar | value | target | |", "|---|---|---|---|"]
    lines += [f"| {b.name} | {b.value:.1f} | {b.op} {b.threshold:g} | "
              f"{'PASS' if b.passed else 'MISS'} |" for b in report.bars]
    return "\n".join([*lines, "", *[f"- {n}" for n in report.notes]])
