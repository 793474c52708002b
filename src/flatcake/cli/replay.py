"""``flatcake replay``: one (system, rate) replay of a trace or the built-in workload."""

from __future__ import annotations

import argparse
import json
import sys
import time

from flatcake.replay.load import DEFAULT_SESSIONS, load_workload
from flatcake.replay.metrics import format_metrics
from flatcake.replay.presets import PRESETS, get_preset
from flatcake.replay.run import run_replay
from flatcake.replay.systems import SYSTEMS


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", default=None,
                   help="trace file (Claude Code, Mooncake, native; gzip ok); default: the "
                        "built-in generated agent workload")
    p.add_argument("--format", default=None, help="trace format (default: detected)")
    p.add_argument("--preset", default="paper", choices=sorted(PRESETS),
                   help="node, budgets and model (default: paper)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds session arrivals (and the built-in workload)")
    p.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS,
                   help=f"sessions of the built-in workload (default {DEFAULT_SESSIONS})")
    p.add_argument("--workload", default="agent", choices=("agent", "chat", "mixed"),
                   help="kind of built-in workload (default agent)")
    p.add_argument("--routing", default=None, choices=("round_robin", "session", "prefix"),
                   help="override the preset's request routing")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="built-in workload: cap agent contexts at this many tokens "
                        "(compaction), e.g. 16384 or 65536 for the llama70b comparison")
    p.add_argument("--block-tokens", type=int, default=None,
                   help="built-in workload: tokens per block (default: the preset's)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="simulate one system at one load on a trace",
                       description="Replay a trace (or the built-in agent workload) on a "
                                   "simulated node and print hit rate, TTFT, SSD metrics.")
    add_workload_args(p)
    p.add_argument("--system", default="flatcake", choices=SYSTEMS)
    p.add_argument("--rate", type=float, default=0.5, help="mean request rate (req/s)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--explain", action="store_true",
                   help="print the preset's assumptions first")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset)
    if args.routing:
        preset = preset.with_node(routing=args.routing)
    if args.rate <= 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if args.explain:
        print(f"preset {preset.name}: {preset.description}")
        for a in preset.assumptions:
            print(f"  - {a}")
    wl, timings = load_workload(args.trace, format=args.format, sessions=args.sessions,
                                kind=args.workload, seed=args.seed,
                                block_tokens=args.block_tokens or preset.builtin_block_tokens,
                                context_tokens=args.context_tokens)
    start = time.perf_counter()
    m = run_replay(wl, args.system, args.rate, preset, seed=args.seed)
    total = time.perf_counter() - start
    if args.json:
        d = m.to_dict()
        d["timings"] = {**timings, "replay_s": total}
        json.dump(d, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    print(wl.summary())
    print(format_metrics(m))
    load = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"  timing: {load}; replay {total:.1f} s")
    return 0
