"""``flatcake bench --node-load``: the node service under load. One ``flatcake serve`` on a
fresh root (``bench.node.served``, the books of ``bench.connector.SETTINGS``); CLIENTS
spawned processes, each attached as an engine client (``RemoteSchedulerSide``, the path
the vLLM connector takes), drive requests through vLLM's hooks (``bench.connector.Driver``)
with open-loop Poisson arrivals at rising total rates::

    request   a prompt of PROMPT_TOKENS tokens: new (a miss, then stored) or, with
              probability REPEAT, one this client stored before (a hit: admitted, loaded)
    rate      every client runs SECONDS at rate / CLIENTS; the wall latency of each
              of the driver's timed hooks: the lookup (num_matched_tokens), the
              admission (after_alloc and the step; the load's report) and the store
              (the step planning it; its report); the service's CPU per request off
              /proc, and the clients' own (``time.process_time``, every thread
              included) beside it: on a machine the clients share with the
              service, their sum is what a request costs the machine
    books     after each rate, off ``flatcake serve --status``: no pin, store or load in
              flight, one session per prompt stored, the SSD bytes a whole number of
              prompts
    stop      when p99 lookup latency passes --p99-bound-ms or the clients fall behind
              their arrivals (the last served over 10 % past the window): the rate is
              not delivered; the highest rate delivered before is the saturation rate

Books only: no KV bytes move (the workers' reports are made up), as ``--connector``.
Every wait is bounded; clients and the service are ended on any error.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flatcake.bench.connector import SETTINGS, Driver, _service_cpu_s

CALLS = ("lookup", "admission", "store")
LATE = 1.1  # the arrivals of a rate served 10 % past its window: the rate not delivered
BAR_RATE, BAR_P99_MS = 1000.0, 2.0  # the bar: p99 lookup at 1,000 requests/s in total


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What ``--node-load`` runs (``directory``: where the service's root goes)."""

    directory: str
    model: str = "llama-3.1-8b"
    clients: int = 8
    rates: tuple[float, ...] = (250, 500, 1000, 2000, 4000, 8000)
    seconds: float = 3.0
    prompt_tokens: int = 2048
    repeat: float = 0.5
    p99_bound_ms: float = 20.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.clients, int) or self.clients < 1:
            raise ValueError(f"--clients must be an int >= 1, got {self.clients!r}")
        if not self.rates or any(r <= 0 for r in self.rates):
            raise ValueError(f"--rates must be numbers > 0, got {self.rates!r}")
        if self.seconds <= 0 or not 0 <= self.repeat < 1:
            raise ValueError("--seconds must be > 0 and the repeat share in [0, 1)")


@dataclass(frozen=True, slots=True)
class RateResult:
    """One offered total rate: what was delivered, latencies (ms) by call, the books."""

    offered: float
    delivered: float
    requests: int
    latencies_ms: dict[str, list[float]] = field(repr=False)
    service_cpu_us: float
    clients_cpu_us: float  # the clients' CPU per request, summed over clients
    books: dict[str, Any]
    books_clean: bool

    def pct(self, call: str, q: float) -> float:
        xs = sorted(self.latencies_ms[call])
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


class LoadDriver(Driver):
    """``Driver`` with each call's wall latency kept, by the phase it belongs to."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: list[tuple[str, float]] = []

    def _timed(self, phase: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.calls.append((phase, time.perf_counter() - t0))
        return out


def _client(sock: str, model: str, index: int, seed: int, prompt_blocks: int,
            repeat: float, conn: Any) -> None:
    """One attached engine client (spawned): for each ``(rate, seconds)`` it is sent,
    Poisson arrivals of prompts for ``seconds``; sends back latencies and counts."""
    from flatcake.bench.node import attached_config
    from flatcake.connectors.node_client import RemoteSchedulerSide
    from flatcake.geometry import preset

    geometry = preset(model)
    side = RemoteSchedulerSide(geometry, attached_config(Path(sock)),
                               name=f"load-{index}")
    rng = random.Random(seed * 1000 + index)
    stored: list[list[bytes]] = []
    d = LoadDriver(side, geometry.tokens_per_block, geometry.name, f"load{index}-r")
    try:
        conn.send("ready")
        while (job := conn.recv()) is not None:
            rate, seconds = job
            lat: dict[str, list[float]] = {c: [] for c in CALLS}
            new = 0
            cpu0, start = time.process_time(), time.perf_counter()
            due = start + rng.expovariate(rate)
            while due < start + seconds:
                time.sleep(max(0.0, due - time.perf_counter()))
                hit = bool(stored) and rng.random() < repeat
                prompt = (rng.choice(stored) if hit else
                          [rng.randbytes(32) for _ in range(prompt_blocks)])
                d.calls.clear()
                d.request(prompt, 0)
                if not hit:
                    stored.append(prompt)
                    new += 1
                lookups = [s for p, s in d.calls if p == "lookup"]
                lat["lookup"].append(lookups[-1] * 1e3)  # num_matched_tokens
                for call in ("admission", "store"):
                    spent = [s for p, s in d.calls if p == call]
                    if spent and (call == "admission") == hit:
                        lat[call].append(sum(spent) * 1e3)
                due += rng.expovariate(rate)
            conn.send({"latencies": lat, "requests": len(lat["lookup"]), "new": new,
                       "elapsed": time.perf_counter() - start,
                       "cpu_s": time.process_time() - cpu0})
    except Exception as exc:  # the parent reports it and ends the run
        conn.send({"error": f"client {index}: {type(exc).__name__}: {exc}"})
    finally:
        side.close()


def _books(sock: Path, stored: int) -> tuple[dict[str, Any], bool]:
    """The service's books once nothing is in flight (waits up to 5 s for it), and
    whether they are clean: nothing pinned or in flight, no store refused, every live
    session whole (the same bytes each) and every new prompt stored once: as a live
    session, or as one reclaimed (a repeat of a reclaimed prompt is stored again)."""
    from flatcake.service.endpoint import ask_status

    deadline = time.monotonic() + 5.0
    while True:
        st = ask_status(sock, 10.0)
        books = {k: st.get(k) for k in ("pinned_sessions", "stores_in_flight",
                                         "loads_in_flight", "sessions", "ssd_used_bytes",
                                         "sessions_reclaimed_ssd", "stores_rejected")}
        idle = not (books["pinned_sessions"] or books["stores_in_flight"]
                    or books["loads_in_flight"])
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return books, idle and books_whole(books, stored)


def books_whole(books: dict[str, Any], stored: int) -> bool:
    """``_books``'s test of the figures, once nothing is in flight."""
    sessions, used = books["sessions"] or 0, books["ssd_used_bytes"] or 0
    gone = books["sessions_reclaimed_ssd"] or 0
    return (sessions == stored if not gone else sessions + gone >= stored) and \
        not books["stores_rejected"] and \
        (sessions == 0 or (used > 0 and used % sessions == 0))


def run_node_load(options: LoadOptions) -> tuple[list[RateResult], float]:
    """Run rising rates until the service saturates (module docstring); returns the
    rows and the saturation rate (0 when the first rate already saturates)."""
    import multiprocessing as mp

    from flatcake.bench.node import served
    from flatcake.geometry import preset

    geometry = preset(options.model)
    blocks = max(1, options.prompt_tokens // geometry.tokens_per_block)
    work = Path(options.directory).absolute() / f"flatcake-node-load-{os.getpid()}"
    work.mkdir(parents=True, mode=0o700)
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    conns: list[Any] = []
    rows: list[RateResult] = []
    saturation, stored = 0.0, 0
    try:
        with served(work / "root", *SETTINGS) as (sock, pid):
            for i in range(options.clients):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_client, daemon=True, args=(
                    str(sock), options.model, i, options.seed, blocks, options.repeat,
                    theirs))
                p.start()
                procs.append(p)
                conns.append(mine)
            for c in conns:
                _recv(c, 120.0)
            for rate in options.rates:
                cpu0 = _service_cpu_s(pid)
                for c in conns:
                    c.send((rate / options.clients, options.seconds))
                got = [_recv(c, options.seconds * 4 + 60.0) for c in conns]
                cpu = _service_cpu_s(pid) - cpu0
                n = sum(g["requests"] for g in got)
                stored += sum(g["new"] for g in got)
                lat = {call: [x for g in got for x in g["latencies"][call]] for call in CALLS}
                books, clean = _books(sock, stored)
                window = max([options.seconds, *[g["elapsed"] for g in got]])
                mine = sum(g["cpu_s"] for g in got)
                row = RateResult(rate, n / window, n, lat,
                                 cpu / n * 1e6 if n else 0.0,
                                 mine / n * 1e6 if n else 0.0, books, clean)
                rows.append(row)
                if (row.pct("lookup", 0.99) > options.p99_bound_ms
                        or window > LATE * options.seconds):
                    break
                saturation = row.delivered
            for c in conns:
                c.send(None)
            for p in procs:
                p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return rows, saturation


def _recv(conn: Any, timeout_s: float) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"a load client did not answer within {timeout_s:.0f} s")
    got = conn.recv()
    if isinstance(got, dict) and "error" in got:
        raise RuntimeError(got["error"])
    return got


def _cells(rows: list[RateResult]) -> tuple[list[str], list[list[str]]]:
    head = ["offered/s", "delivered/s", "requests", *[f"{c} p50/p99 ms" for c in CALLS],
            "service CPU us/req", "clients CPU us/req", "books"]
    body = [[f"{r.offered:g}", f"{r.delivered:.0f}", str(r.requests),
             *[f"{r.pct(c, 0.5):.2f}/{r.pct(c, 0.99):.2f}" for c in CALLS],
             f"{r.service_cpu_us:.0f}", f"{r.clients_cpu_us:.0f}",
             "clean" if r.books_clean else f"NOT CLEAN {r.books}"]
            for r in rows]
    return head, body


def _bar(rows: list[RateResult]) -> str:
    """The p99 lookup latency at BAR_RATE requests/s against BAR_P99_MS."""
    at = [r for r in rows if r.offered == BAR_RATE]
    if not at:
        return f"p99 lookup at {BAR_RATE:g} requests/s: not run (bar <= {BAR_P99_MS:g} ms)"
    p99 = at[0].pct("lookup", 0.99)
    return (f"p99 lookup at {BAR_RATE:g} requests/s: {p99:.2f} ms (bar <= {BAR_P99_MS:g} "
            f"ms: {'met' if p99 <= BAR_P99_MS else 'missed'})")


def _summary(rows: list[RateResult], saturation: float, options: LoadOptions,
             load: tuple[float, float]) -> list[str]:
    return [_bar(rows), f"saturation rate: {saturation:.0f} requests/s delivered (p99 lookup "
            f"<= {options.p99_bound_ms:g} ms, arrivals served within {LATE:g}x the window)",
            f"1-minute load average {load[0]:.2f} at start, {load[1]:.2f} at end, on "
            f"{os.cpu_count()} CPUs"]


def _title(options: LoadOptions) -> str:
    return (f"{options.clients} attached clients, {options.prompt_tokens}-token prompts "
            f"({options.model}), {options.repeat:.0%} repeats, {options.seconds:g} s per "
            "rate, open-loop Poisson")


def format_load_table(rows: list[RateResult], saturation: float, options: LoadOptions,
                      load: tuple[float, float]) -> str:
    """The rows as text, the saturation rate and the load average under them."""
    head, body = _cells(rows)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = [f"flatcake bench --node-load: {_title(options)}", ""]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True))
              for r in [head, *body]]
    return "\n".join([*lines, "", *_summary(rows, saturation, options, load)])


def format_load_markdown(rows: list[RateResult], saturation: float, options: LoadOptions,
                         load: tuple[float, float]) -> str:
    """What ``format_load_table`` prints, as markdown (``--docs-out``)."""
    head, body = _cells(rows)
    lines = [f"{_title(options)}.", "", f"| {' | '.join(head)} |", "|" + "---|" * len(head),
             *[f"| {' | '.join(r)} |" for r in body]]
    return "\n".join([*lines, "", *[f"- {x}" for x in _summary(rows, saturation, options, load)]])
