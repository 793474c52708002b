"""The replay checked against a real engine: predicted next to measured.

    python -m flatcake.report.realcheck loadgen-compare/runs [--calibration FILE]
        [--docs-out docs/results/generated/realcheck.md]

Reads the loadgen result folders that ``scripts/loadgen_compare.py`` wrote (one per
server configuration and working set, named ``<repeat>-<config>-ws<N>``), fits the engine's
costs from the no-connector runs' per-request records (prefill seconds per uncached and
per cached prompt token, the lower quartile of each request class's TTFT so that a
request waiting behind the other one's prefill does not count; decode seconds per output
token, the median), builds a one-engine replay preset from them (the engine's cache in
blocks, FlatCake's memory and SSD budgets, the ``local`` preset's disk figures or a
``flatcake bench --calibrate`` file), replays each run's requests (the warm-up pass, then
the measured ones, at the times they were sent, each prompt's blocks shared between its
visits and each question a block of its own) through the replay's system for that
configuration (``none``: the engine's own cache, ``memory-only`` with no host memory;
``flatcake``) and prints predicted next to measured cached share and mean / p50 TTFT with
the error of each against the bar (3 points, 30 %).
"""

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

from flatcake import docsout
from flatcake.geometry import KVGeometry
from flatcake.replay.node.arrivals import window_rate
from flatcake.replay.node.devices import GpuSpec
from flatcake.replay.presets import LOCAL, ReplayPreset, with_calibration
from flatcake.replay.simulate import replay_node
from flatcake.replay.workload.trace import from_requests
from flatcake.report.engine_runs import Costs, Run, fit_costs, load_runs, measured

SYSTEM = {"none": "memory-only", "flatcake": "flatcake"}
"""Each measured configuration's replay system."""
SHARE_BAR_POINTS = 3.0
TTFT_BAR = 0.30
PROMPT = re.compile(r"^ws-(\d+)(?:-s\d+)?$")
MIB = 1 << 20


def build_preset(costs: Costs, args: argparse.Namespace) -> ReplayPreset:
    """One engine with the fitted costs, its cache and FlatCake's budgets, on the
    ``local`` preset's disk (or ``--calibration``'s costs)."""
    base = with_calibration(LOCAL, args.calibration) if args.calibration else LOCAL
    layers, heads, dim = (int(x) for x in args.geometry.split(","))
    geometry = KVGeometry(num_layers=layers, tokens_per_block=args.block_tokens,
                          num_kv_heads=heads, head_dim=dim, dtype=args.dtype,
                          name="engine")
    gpu = GpuSpec(kv_capacity_bytes=args.engine_blocks * geometry.block_bytes,
                  prefill_tokens_per_s=1.0 / costs.uncached_s, attn_s_per_token_pair=0.0,
                  prefill_overhead_s=0.0, decode_step_base_s=costs.decode_s,
                  decode_step_per_seq_s=0.0, hbm_bytes_per_s=1e18,
                  prefill_s_per_cached_token=costs.cached_s)
    node = dataclasses.replace(base.node, num_workers=1, gpu=gpu,
                               host_memory_bytes=args.memory_mib * MIB,
                               ssd=dataclasses.replace(base.node.ssd,
                                                       capacity_bytes=args.ssd_mib * MIB))
    store = dataclasses.replace(base.flatcake.store, session_file_bytes=64 * MIB)
    return dataclasses.replace(base, name="engine", geometry=geometry, node=node,
                               flatcake=dataclasses.replace(base.flatcake, store=store))


def predict(run: Run, preset: ReplayPreset, block_tokens: int) -> dict[str, float]:
    """Replay ``run``'s warm-up and measured requests at their send times; the measured
    ones' cached share and TTFT."""
    per_prompt = -(-run.prompt_tokens // block_tokens)
    fresh = 1 << 40
    requests: list[tuple[float, list[int], int, int]] = []
    offset = 0.0
    for part in (run.warmup, run.records):
        for r in part:
            m = PROMPT.match(str(r.get("session_id", "")))
            if m is None:
                raise ValueError(f"{run.name}: request {r.get('index')} is not a "
                                 f"working-set visit (session {r.get('session_id')!r})")
            blocks = [int(m.group(1)) * per_prompt + j for j in range(per_prompt)]
            extra = -(-int(r["prompt_tokens"]) // block_tokens) - per_prompt
            blocks += list(range(fresh, fresh + extra))
            fresh += extra
            requests.append((offset + float(r["sent_s"]), blocks, int(r["prompt_tokens"]),
                             int(r["completion_tokens"])))
        offset = max((t + 1.0 for t, *_ in requests), default=0.0) if part is run.warmup \
            else offset
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
            "p50": float(np.median(ttft))}

def lacks(run: Run, meas: dict[str, float], pred: dict[str, float],
          runs: list[Run], costs: Costs) -> str:
    """Which cost the model lacks, from what the records show."""
    if pred["mean"] > meas["mean"]:
        return ("the model charges more than the engine paid: the fitted prefill cost is "
                "too high for this run (it was fitted at another load)")
    if run.config == "flatcake":
        same = [r for r in runs if r.config == "none" and r.working_set == run.working_set]
        hit = [float(r["ttft_s"]) for r in run.records if r["cached_tokens"]]
        base = [float(r["ttft_s"]) for x in same for r in x.records if r["cached_tokens"]]
        if hit and base:
            return (f"the connector's cost per request on the engine's 2 cores: a cached "
                    f"request's TTFT is {np.mean(hit):.3f} s mean with FlatCake against "
                    f"{np.mean(base):.3f} s without it; the replay charges only the "
                    "restore's disk time, not the store's threads competing with the "
                    "engine for the CPU nor the connector's per-step work")
        return ("the connector's per-step cost and its threads on the engine's 2 cores "
                "(the replay charges only the restore's disk time)")
    unq = costs.uncached_s * float(np.mean([r["prompt_tokens"] for r in run.records]))
    return (f"queueing and CPU contention: the unqueued prefill fitted is {unq:.3f} s per "
            f"uncached prompt, the measured mean {meas['mean']:.3f} s; at concurrency 2 a "
            "request waits behind the other's prefill and both share the engine's 2 "
            "cores with other processes (the replay prefills one at a time at the fitted "
            "speed)")


def table(runs: list[Run], preset: ReplayPreset, costs: Costs,
          block_tokens: int) -> tuple[str, list[str]]:
    lines = ["| run | config | working set | requests | cached share: measured / "
             "predicted (error) | TTFT mean (s): measured / predicted (error) | TTFT p50 "
             "(s): measured / predicted (error) | bar | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for run in runs:
        meas, pred = measured(run), predict(run, preset, block_tokens)
        share_err = 100 * (pred["share"] - meas["share"])
        mean_err = pred["mean"] / meas["mean"] - 1
        p50_err = pred["p50"] / meas["p50"] - 1
        met = abs(share_err) <= SHARE_BAR_POINTS and abs(mean_err) <= TTFT_BAR
        lines.append(
            f"| {run.name} | {run.config} | {run.working_set} | {len(run.records)} | "
            f"{100 * meas['share']:.1f} % / {100 * pred['share']:.1f} % "
            f"({share_err:+.1f} points) | {meas['mean']:.3f} / {pred['mean']:.3f} "
            f"({100 * mean_err:+.0f} %) | {meas['p50']:.3f} / {pred['p50']:.3f} "
            f"({100 * p50_err:+.0f} %) | {'met' if met else 'missed'} | {run.load} |")
        if not met:
            what = ("cached share" if abs(share_err) > SHARE_BAR_POINTS else "") + \
                (" and " if abs(share_err) > SHARE_BAR_POINTS and abs(mean_err) > TTFT_BAR
                 else "") + ("mean TTFT" if abs(mean_err) > TTFT_BAR else "")
            notes.append(f"- {run.name}: {what} off; the model lacks "
                         f"{lacks(run, meas, pred, runs, costs)}.")
    return "\n".join(lines), notes


def report(args: argparse.Namespace) -> str:
    runs = load_runs(args.folder)
    costs = fit_costs(runs)
    preset = build_preset(costs, args)
    body, notes = table(runs, preset, costs, args.block_tokens)
    return "\n".join([
        f"Engine costs fitted from {costs.requests} no-connector requests: prefill "
        f"{costs.uncached_s * 1e3:.3f} ms per uncached token, {costs.cached_s * 1e3:.4f} ms "
        f"per cached token, decode {costs.decode_s * 1e3:.1f} ms per output token. Replay: "
        f"one engine of {args.engine_blocks} blocks of {args.block_tokens} tokens, FlatCake "
        f"{args.memory_mib} MiB memory + {args.ssd_mib} MiB SSD, disk {preset.cost_source}; "
        "each run's requests sent when they were measured. Bar: cached share within "
        f"{SHARE_BAR_POINTS:g} points, mean TTFT within {100 * TTFT_BAR:.0f} %.", "",
        body, "", *notes, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flatcake.report.realcheck",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="scripts/loadgen_compare.py's --out (or its "
                   "runs/ folder, or one loadgen result folder)")
    p.add_argument("--engine-blocks", type=int, default=150,
                   help="the engine's KV cache in blocks (vLLM --num-gpu-blocks-override)")
    p.add_argument("--block-tokens", type=int, default=32, help="the engine's block size")
    p.add_argument("--geometry", default="12,4,64", metavar="LAYERS,HEADS,DIM",
                   help="the model's KV layers, KV heads and head dim")
    p.add_argument("--dtype", default="float32", help="the KV cache's element type")
    p.add_argument("--memory-mib", type=int, default=32, help="FlatCake's host memory")
    p.add_argument("--ssd-mib", type=int, default=2048, help="FlatCake's SSD budget")
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
