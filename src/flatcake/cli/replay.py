"""``flatcake replay``: one (system, rate) replay of a trace or the built-in workload."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

from flatcake.replay.node.metrics import DEFAULT_DRIVE_BYTES
from flatcake.replay.presets import PRESETS, ReplayPreset
from flatcake.replay.systems import ALL_SYSTEMS
from flatcake.replay.workload.source import SESSIONS_BY_KIND

if TYPE_CHECKING:
    from flatcake.replay.cluster import ClusterSpec

DESCRIPTION = ("Replay a trace (or the built-in agent workload) on a simulated node and "
               "print hit rate, TTFT, SSD metrics. --explain alone prints the preset's "
               "assumptions and exits.")
DEFAULT_SYSTEM = "flatcake"
DEFAULT_RATE = 0.5


def add_workload_args(p: argparse.ArgumentParser, kinds_help: str | None = None) -> None:
    p.add_argument("trace", nargs="?", default=None,
                   help="trace file (Claude Code, Mooncake, native; gzip ok); default: the "
                        "built-in generated agent workload")
    p.add_argument("--format", default=None, help="trace format (default: detected)")
    p.add_argument("--preset", default="paper", choices=sorted(PRESETS),
                   help="node, budgets and model (default: paper)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds session arrivals (and the built-in workload)")
    p.add_argument("--sessions", type=int, default=None,
                   help="sessions of the built-in workload (default: " + ", ".join(
                       f"{n} {k}" for k, n in SESSIONS_BY_KIND.items()) + ")")
    if kinds_help is None:
        p.add_argument("--workload", default="agent", choices=("agent", "chat", "mixed"),
                       help="kind of built-in workload (default agent)")
    else:
        p.add_argument("--workload", default=None, help=kinds_help)
    p.add_argument("--routing", default=None, choices=("round_robin", "session", "prefix"),
                   help="override the preset's request routing")
    p.add_argument("--nodes", type=int, default=1,
                   help="replay a cluster of this many nodes, each the preset's whole node "
                        "(default 1); --rate is the cluster's total")
    p.add_argument("--node-routing", default="session", choices=("session", "round_robin"),
                   help="with --nodes: session-affine (a hash of the session picks the "
                        "node) or round robin per request (default session); --routing "
                        "still picks the worker inside a node")
    p.add_argument("--no-sharing", action="store_true",
                   help="with --nodes: each node sees only its own store (default: the "
                        "nodes share KV through the cluster index)")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="built-in workload: cap agent contexts at this many tokens "
                        "(compaction), e.g. 16384 or 65536 for the llama70b comparison")
    p.add_argument("--drive-tb", type=float, default=DEFAULT_DRIVE_BYTES / 1e12,
                   help="state drive-writes per day for an SSD of this many TB (default "
                        f"{DEFAULT_DRIVE_BYTES / 1e12:g})")
    p.add_argument("--block-tokens", type=int, default=None,
                   help="built-in workload: tokens per block (default: the preset's)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_args(p)
    p.add_argument("--system", default=None, choices=ALL_SYSTEMS,
                   help=f"system to simulate (default {DEFAULT_SYSTEM})")
    p.add_argument("--rate", type=float, default=None,
                   help=f"mean request rate in req/s (default {DEFAULT_RATE:g})")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--config", default=None,
                   help="FlatCake TOML config: every key it sets of [placement], "
                        "[reclaim], [planner], [scheduler] and the [store] window keys "
                        "(release_old_windows, release_windows_at_once, window_rows, "
                        "window_row_stride_tokens, window_row_stride_dense_tokens) "
                        "replaces the preset's (e.g. the "
                        "snippet 'flatcake tune' prints); "
                        "budgets stay the preset's (other keys are listed and ignored)")
    p.add_argument("--explain", action="store_true",
                   help="print the preset's assumptions and exit; with TRACE, --rate or "
                        "--system, print them and run (to stderr with --json)")


def drive_bytes(args: argparse.Namespace) -> int:
    """``--drive-tb`` in bytes (checked)."""
    if args.drive_tb <= 0:
        raise ValueError(f"--drive-tb must be > 0, got {args.drive_tb}")
    return round(args.drive_tb * 1e12)


def explain(preset: ReplayPreset) -> str:
    """The preset's description and every assumption it makes, one per line."""
    return "\n".join([f"preset {preset.name}: {preset.description}",
                      *(f"  {line}" for line in preset.geometry_lines()),
                      *(f"  - {a}" for a in preset.assumptions)])


def cluster_spec(args: argparse.Namespace) -> ClusterSpec | None:
    """The cluster ``--nodes``, ``--node-routing`` and ``--no-sharing`` ask for; None for
    one node (the one-node replay)."""
    if args.nodes == 1:
        return None
    from flatcake.replay.cluster import ClusterSpec

    return ClusterSpec(args.nodes, args.node_routing, not args.no_sharing)


def run(args: argparse.Namespace) -> int:
    from flatcake.replay.node.metrics import format_metrics
    from flatcake.replay.presets import get_preset
    from flatcake.replay.simulate import run_replay
    from flatcake.replay.workload.source import load_workload

    preset = get_preset(args.preset)
    if args.routing:
        preset = preset.with_node(routing=args.routing)
    if args.config:
        from flatcake.tune import replay_config

        preset, ignored = replay_config(preset, args.config)
        if ignored:
            print(f"{args.config}: not honoured by the replay (the preset's node sets "
                  f"them): {', '.join(ignored)}", file=sys.stderr)
    rate = DEFAULT_RATE if args.rate is None else args.rate
    if rate <= 0:
        raise ValueError(f"--rate must be > 0, got {rate}")
    if args.explain:
        print(explain(preset), file=sys.stderr if args.json else sys.stdout)
        if args.trace is None and args.rate is None and args.system is None:
            return 0
    wl, timings = load_workload(args.trace, format=args.format, sessions=args.sessions,
                                kind=args.workload, seed=args.seed,
                                block_tokens=args.block_tokens or preset.builtin_block_tokens,
                                context_tokens=args.context_tokens)
    start = time.perf_counter()
    system = args.system or DEFAULT_SYSTEM
    spec = cluster_spec(args)
    if spec is None:
        m = run_replay(wl, system, rate, preset, seed=args.seed)
    else:
        from flatcake.replay.cluster import run_cluster

        m = run_cluster(wl, system, rate, preset, spec, seed=args.seed)
    total = time.perf_counter() - start
    m = dataclasses.replace(m, drive_bytes=drive_bytes(args))
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
