"""The replay checked against a real engine: predicted next to measured.

    python -m flatcake.report.realcheck loadgen-compare/runs [--calibration FILE]
        [--docs-out docs/results/generated/realcheck.md]

Reads the loadgen result folders that ``scripts/loadgen_compare.py`` wrote (one per
server configuration and workload: ``<repeat>-<config>-ws<N>`` for a working set,
``<repeat>-<config>-trace`` for a trace replay) and each server's log beside them. The
engine comes from the log and the model's ``config.json`` (``report.engine_log``: the
prefix cache in blocks, the block size, the KV geometry, FlatCake's budgets); its costs
are fitted from the no-connector runs of the working-set sweep (``report.engine_runs``:
prefill seconds per uncached and per cached prompt token, decode seconds per output
token), so a trace run is predicted from costs measured on other traffic. Each run's
requests (the warm-up pass, then the measured ones, at the times they were sent) are
replayed with their prompts as the engine saw them: each record names its prompt's
loadgen blocks, which ``engine_requests`` turns into the engine's blocks. The replay's
system for a configuration (``none``: the engine's own cache, ``memory-only`` with no
host memory; ``flatcake``) gives the cached share and mean / p50 TTFT, printed next to
the measured ones with the error of each against the bar (3 points, 30 %), and for a
miss, the cost the model lacks.
"""

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flatcake import docsout
from flatcake.geometry import KVGeometry
from flatcake.replay.node.arrivals import window_rate
from flatcake.replay.node.devices import GpuSpec
from flatcake.replay.presets import LOCAL, ReplayPreset, with_calibration
from flatcake.replay.simulate import replay_node
from flatcake.replay.workload.trace import from_requests
from flatcake.report.engine_log import EngineFacts, read_engine
from flatcake.report.engine_runs import Costs, Run, fit_costs, load_runs, measured

SYSTEM = {"none": "memory-only", "flatcake": "flatcake"}
"""Each measured configuration's replay system."""
SHARE_BAR_POINTS = 3.0
TTFT_BAR = 0.30
MIB = 1 << 20


@dataclass(frozen=True)
class Engine:
    """What a run's replay is built from: the engine's cache and KV geometry, FlatCake's
    budgets (None for a run without FlatCake when its log names none)."""

    facts: EngineFacts
    memory_bytes: int | None
    ssd_bytes: int | None


def engine_of(run: Run, args: argparse.Namespace) -> Engine:
    """``run``'s engine: its server log and model config (``report.engine_log``), each
    field overridden by the flag that names it; a ``ValueError`` naming what is missing."""
    facts = read_engine(run.log) if run.log is not None else None
    blocks = args.engine_blocks or (facts.cache_blocks if facts else None)
    block = args.block_tokens or (facts.block_tokens if facts else None)
    geometry = facts.geometry if facts else None
    if args.geometry and block:
        try:
            layers, heads, dim = (int(x) for x in args.geometry.split(","))
        except ValueError:
            raise ValueError(f"--geometry must be LAYERS,HEADS,DIM, got "
                             f"{args.geometry!r}") from None
        geometry = KVGeometry(num_layers=layers, tokens_per_block=block, num_kv_heads=heads,
                              head_dim=dim, dtype=geometry.dtype if geometry else "float32")
    if blocks is None or block is None or geometry is None:
        raise ValueError(f"{run.name}: no server log beside it (server-<repeat>-<config>.log "
                         "in the folder above runs/) to read the engine's cache and KV "
                         "geometry from; give --engine-blocks, --block-tokens and --geometry")
    geometry = dataclasses.replace(geometry.with_block_size(block), name="engine",
                                   dtype=args.dtype or geometry.dtype)
    flags = [f for f, v in (("--engine-blocks", args.engine_blocks),
                            ("--block-tokens", args.block_tokens),
                            ("--geometry", args.geometry), ("--dtype", args.dtype)) if v]
    source = ", ".join(([facts.source] if facts else []) + flags)
    memory = args.memory_mib * MIB if args.memory_mib is not None else \
        (facts.flatcake_memory_bytes if facts else None)
    ssd = args.ssd_mib * MIB if args.ssd_mib is not None else \
        (facts.flatcake_ssd_bytes if facts else None)
    if run.config == "flatcake" and (memory is None or ssd is None):
        raise ValueError(f"{run.name}: FlatCake's budgets are not in a server log; give "
                         "--memory-mib and --ssd-mib")
    return Engine(EngineFacts(blocks, block, geometry, source,
                              model=facts.model if facts and not args.geometry else "",
                              ssd_loads_in_step=facts.ssd_loads_in_step if facts else False,
                              in_step_source=facts.in_step_source if facts else ""),
                  memory, ssd)


def build_preset(costs: Costs, engine: Engine, calibration: Path | None) -> ReplayPreset:
    """One engine with the fitted costs, its cache and FlatCake's budgets, on the
    ``local`` preset's disk (or ``--calibration``'s costs)."""
    base = with_calibration(LOCAL, calibration) if calibration else LOCAL
    geometry = engine.facts.geometry
    gpu = GpuSpec(kv_capacity_bytes=engine.facts.cache_blocks * geometry.block_bytes,
                  prefill_tokens_per_s=1.0 / costs.uncached_s, attn_s_per_token_pair=0.0,
                  prefill_overhead_s=0.0, decode_step_base_s=costs.decode_s,
                  decode_step_per_seq_s=0.0, hbm_bytes_per_s=1e18,
                  prefill_s_per_cached_token=costs.cached_s)
    node = dataclasses.replace(base.node, num_workers=1, gpu=gpu,
                               ssd_loads_in_step=engine.facts.ssd_loads_in_step,
                               host_memory_bytes=engine.memory_bytes or 0,
                               ssd=dataclasses.replace(base.node.ssd,
                                                       capacity_bytes=engine.ssd_bytes or 0))
    store = dataclasses.replace(base.flatcake.store, session_file_bytes=64 * MIB)
    return dataclasses.replace(base, name="engine", geometry=geometry, node=node,
                               flatcake=dataclasses.replace(base.flatcake, store=store))


def engine_requests(run: Run, block_tokens: int) -> list[tuple[float, list[int], int, int]]:
    """``run``'s warm-up then measured requests as the engine saw them: (sent at, the
    prompt's blocks of ``block_tokens`` in the engine, prompt tokens, output tokens).

    A record's ``blocks`` are chained ids of ``run.block_tokens`` tokens each, so the
    tokens up to the end of an engine block are named by the id covering that end and
    the offset into it; an engine block that reaches into the request's own tail, and
    the block holding its last token (vLLM always computes that one), is fresh."""
    names: dict[tuple[int, int], int] = {}
    fresh = 1 << 40
    out: list[tuple[float, list[int], int, int]] = []
    offset = 0.0
    lbt = run.block_tokens
    for part in (run.warmup, run.records):
        for r in part:
            ids = [i for a, b in r["blocks"] for i in range(int(a), int(b))]
            sent = int(r.get("prompt_tokens_sent") or r["prompt_tokens"])
            shared = min(len(ids) * lbt // block_tokens, (sent - 1) // block_tokens)
            blocks = []
            for k in range(shared):
                end = (k + 1) * block_tokens
                j = -(-end // lbt) - 1
                blocks.append(names.setdefault((ids[j], end - j * lbt), len(names)))
            extra = -(-sent // block_tokens) - shared
            blocks += range(fresh, fresh + extra)
            fresh += extra
            out.append((offset + float(r["sent_s"]), blocks, int(r["prompt_tokens"]),
                        int(r["completion_tokens"])))
        offset = max((t + 1.0 for t, *_ in out), default=0.0)
    return out


def predict(run: Run, preset: ReplayPreset, block_tokens: int) -> dict[str, float]:
    """Replay ``run``'s warm-up and measured requests at their send times; the measured
    ones' cached share and TTFT."""
    requests = engine_requests(run, block_tokens)
    wl = from_requests(requests, block_tokens, name=run.name)
    rate = window_rate(wl.time_s) if len(requests) > 1 else 1.0
    if run.config == "none":  # the engine's own cache only
        preset = preset.with_node(host_memory_bytes=0)
    _, node = replay_node(wl, SYSTEM[run.config], rate, preset)
    rec = node.rec
    keep = slice(len(run.warmup), None)
    ttft = (rec.first_token_s - rec.arrival_s)[keep]
    inp = wl.input_tokens[keep]
    cached = np.minimum(rec.hit_blocks[keep] * block_tokens, inp)
    return {"share": float(cached.sum() / inp.sum()), "mean": float(np.mean(ttft)),
            "p50": float(np.median(ttft)), "ssd_bytes": float(rec.ssd_read_bytes),
            "stalled": float(np.mean([float(r["ttft_s"]) > 2 * t + 0.05 for r, t in
                                      zip(run.records, ttft, strict=True)]))}


def lacks(run: Run, meas: dict[str, float], pred: dict[str, float],
          runs: list[Run], costs: Costs, in_step: bool = False) -> str:
    """Which cost the model lacks, from what the run measured (``in_step``: the replay
    loaded its SSD hits in the step, ``NodeSpec.ssd_loads_in_step``)."""
    if pred["mean"] > meas["mean"]:
        if run.config == "flatcake" and pred.get("ssd_bytes") and not in_step:
            return ("the model charges more than the engine paid: it restores each SSD hit "
                    "before the prefill starts, while an engine that loads it in the step "
                    "(a CPU engine's ssd_loads_in_step) overlaps each layer's restore with "
                    "the forward pass")
        return ("the model charges more than the engine paid: the fitted prefill cost is "
                "too high for this run (it was fitted at another load)")
    stalls = (f"{100 * pred['stalled']:.0f} % of its requests waited more than twice "
              f"(+50 ms) the TTFT the replay gives them, at p50 the error is "
              f"{100 * (pred['p50'] / meas['p50'] - 1):+.0f} %")
    wait = ("" if run.stretch is None else
            f"; its model thread waited {run.stretch - 1:.2f} s for a core per s it ran "
            "(charged)")
    if run.config == "flatcake":
        same = [r for r in runs if r.config == "none" and r.working_set == run.working_set]
        cpu = ""
        if run.worker_cpu_s is not None and same and same[0].worker_cpu_s is not None:
            per = 1e3 * run.worker_cpu_s / (len(run.records) + len(run.warmup))
            base = 1e3 * same[0].worker_cpu_s / (len(same[0].records) + len(same[0].warmup))
            cpu = (f"; the worker used {per:.0f} CPU ms per request with FlatCake against "
                   f"{base:.0f} without it on the same workload")
        return ("the model lacks the connector's cost on the engine: the replay charges a "
                f"restore's disk time only{cpu}{wait}; {stalls}")
    what = ("the stalls of a shared 2-core machine beyond the measured CPU wait"
            if run.stretch is not None else
            "the engine's wait for a shared 2-core machine's cores (not measured in this run)")
    return (f"the model lacks {what}: {stalls}{wait} (the replay prefills one request at a "
            "time at the fitted speed)")


def at_stretch(costs: Costs, stretch: float | None) -> Costs:
    """``costs`` on an engine whose model thread took ``stretch`` wall seconds per CPU
    second (``Run.stretch``); unchanged when not measured."""
    f = stretch or 1.0
    return dataclasses.replace(costs, uncached_s=costs.uncached_s * f,
                               cached_s=costs.cached_s * f, decode_s=costs.decode_s * f)


def table(runs: list[Run], engines: dict[str, Engine], costs: Costs,
          calibration: Path | None) -> tuple[str, list[str], int]:
    """The rows, the notes on the misses and how many rows met the bar."""
    lines = ["| run | config | workload | requests | cached share: measured / "
             "predicted (error) | TTFT mean (s): measured / predicted (error) | TTFT p50 "
             "(s): measured / predicted (error) | engine's CPU wait | TTFT mean, "
             "predicted without it (error) | bar | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    met_rows = 0
    for run in runs:
        engine = engines[run.name]
        block = engine.facts.block_tokens
        meas = measured(run)
        pred = predict(run, build_preset(at_stretch(costs, run.stretch), engine,
                                         calibration), block)
        idle = pred if run.stretch is None else \
            predict(run, build_preset(costs, engine, calibration), block)
        share_err = 100 * (pred["share"] - meas["share"])
        mean_err = pred["mean"] / meas["mean"] - 1
        idle_err = idle["mean"] / meas["mean"] - 1
        p50_err = pred["p50"] / meas["p50"] - 1
        met = abs(share_err) <= SHARE_BAR_POINTS and abs(mean_err) <= TTFT_BAR
        met_rows += met
        wait = "-" if run.stretch is None else f"{run.stretch - 1:.2f} s/s"
        lines.append(
            f"| {run.name} | {run.config} | {run.workload} | {len(run.records)} | "
            f"{100 * meas['share']:.1f} % / {100 * pred['share']:.1f} % "
            f"({share_err:+.1f} points) | {meas['mean']:.3f} / {pred['mean']:.3f} "
            f"({100 * mean_err:+.0f} %) | {meas['p50']:.3f} / {pred['p50']:.3f} "
            f"({100 * p50_err:+.0f} %) | {wait} | {idle['mean']:.3f} "
            f"({100 * idle_err:+.0f} %) | {'met' if met else 'missed'} | {run.load} |")
        if not met:
            what = ("cached share" if abs(share_err) > SHARE_BAR_POINTS else "") + \
                (" and " if abs(share_err) > SHARE_BAR_POINTS and abs(mean_err) > TTFT_BAR
                 else "") + ("mean TTFT" if abs(mean_err) > TTFT_BAR else "")
            why = lacks(run, meas, pred, runs, costs, engine.facts.ssd_loads_in_step)
            notes.append(f"- {run.name}: {what} off; {why}.")
    return "\n".join(lines), notes, met_rows


def report(args: argparse.Namespace) -> str:
    runs = load_runs(args.folder)
    sweep = [r for r in runs if r.working_set is not None]
    costs = fit_costs(sweep or runs)
    engines = {run.name: engine_of(run, args) for run in runs}
    body, notes, met = table(runs, engines, costs, args.calibration)
    seen: dict[str, list[str]] = {}
    for e in engines.values():
        budgets = (f"FlatCake {e.memory_bytes / MIB:g} MiB memory + {e.ssd_bytes / MIB:g} MiB "
                   "SSD" if e.memory_bytes is not None and e.ssd_bytes is not None
                   else "")
        what = e.facts.describe() + (f", {budgets}" if budgets else "") + \
            (f", {e.facts.in_step_source}" if e.facts.in_step_source else "")
        seen.setdefault(what, []).append(e.facts.source)
    engine_text = "; ".join(f"{what} (from {', '.join(dict.fromkeys(src))})"
                            for what, src in seen.items())
    disk = build_preset(costs, next(iter(engines.values())), args.calibration).cost_source
    return "\n".join([
        f"Engine costs fitted from {costs.requests} no-connector requests"
        f"{' of the working-set sweep' if sweep and len(sweep) < len(runs) else ''}: "
        f"prefill {costs.uncached_s * 1e3:.3f} ms per uncached token, "
        f"{costs.cached_s * 1e3:.4f} ms per cached token, decode "
        f"{costs.decode_s * 1e3:.1f} ms per output token. Replay: one engine of "
        f"{engine_text}; disk {disk}; each run's requests sent when they were "
        "measured" + (", the engine's costs charged at its measured CPU wait (the "
                      "seconds its model thread waited for a core per second it ran, from "
                      "/proc/PID/task/PID/schedstat over the run; the fit takes each "
                      "no-connector run's wait out)" if any(r.stretch for r in runs)
                      else "") + ". Bar: cached share within "
        f"{SHARE_BAR_POINTS:g} points, mean TTFT within {100 * TTFT_BAR:.0f} %: met in "
        f"{met} of {len(runs)} runs.", "", body, "", *notes, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flatcake.report.realcheck",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="scripts/loadgen_compare.py's --out (or its "
                   "runs/ folder, or one loadgen result folder)")
    p.add_argument("--engine-blocks", type=int, default=None,
                   help="the engine's KV cache in blocks (default: its server log's)")
    p.add_argument("--block-tokens", type=int, default=None,
                   help="the engine's block size (default: its server log's)")
    p.add_argument("--geometry", default=None, metavar="LAYERS,HEADS,DIM",
                   help="the model's KV layers, KV heads and head dim (default: the "
                        "config.json of the model the server log names)")
    p.add_argument("--dtype", default=None,
                   help="the KV cache's element type (default: the server's or the model's)")
    p.add_argument("--memory-mib", type=int, default=None,
                   help="FlatCake's host memory (default: the FlatCake server log's)")
    p.add_argument("--ssd-mib", type=int, default=None,
                   help="FlatCake's SSD budget (default: the FlatCake server log's)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="flatcake bench --calibrate output (default: the local preset's)")
    p.add_argument("--docs-out", type=Path, default=None, metavar="FILE",
                   help="also write the table to FILE for the docs site")
    args = p.parse_args(argv)
    started = docsout.start()
    try:
        text = report(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.docs_out:
        docsout.write(args.docs_out, ["python", "-m", "flatcake.report.realcheck",
                                      *(argv if argv is not None else sys.argv[1:])],
                      text, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
