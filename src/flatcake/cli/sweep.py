"""``flatcake sweep``: the (system x rate) grid on all cores, as tables and plots.

Without a trace it sweeps every built-in workload (agent, chat, mixed), each in its own
folder under ``--out``, and ends with one verdict table per workload; ``--workload``
picks some of them. With a trace, the trace is the workload."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flatcake import progress
from flatcake.cli.replay import add_workload_args, cluster_spec, drive_bytes
from flatcake.replay.presets import PRESETS, ReplayPreset
from flatcake.replay.systems import ALL_SYSTEMS, BUILTIN_SYSTEMS, SYSTEMS

DESCRIPTION = ("Replay a trace (default: the built-in agent, chat and mixed workloads) for "
               "each system at each request rate, on all cores, and write sweep.md, "
               "sweep.csv, sweep.json, plots and report.html to --out (one folder per "
               "built-in workload).")
KINDS = ("agent", "chat", "mixed")


def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates must be comma-separated numbers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"--rates must be positive numbers, got {text!r}")
    return vals


def _systems(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in ALL_SYSTEMS]
    if bad or not names:
        raise ValueError(f"--systems: unknown {bad or text!r}; choose from "
                         f"{', '.join(ALL_SYSTEMS)}")
    return names


def _kinds(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in KINDS]
    if bad or not names:
        raise ValueError(f"--workload: unknown {bad or text!r}; choose from {', '.join(KINDS)} "
                         "(comma-separated)")
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_args(p, kinds_help="comma-separated built-in workloads to sweep, each in "
                                    "its own folder under --out (default: " + ",".join(KINDS)
                                    + "; ignored with a trace)")
    p.add_argument("--rates", default=None,
                   help="comma-separated request rates (default: the preset's; " + "; ".join(
                       f"{name}: {','.join(f'{r:g}' for r in pr.rates)}"
                       for name, pr in sorted(PRESETS.items())) + ")")
    p.add_argument("--systems", default=None,
                   help=f"comma-separated systems (default with a trace: {','.join(SYSTEMS)}; "
                        f"on the built-in workloads: {','.join(BUILTIN_SYSTEMS)})")
    p.add_argument("--out", default="replay-sweep", help="output directory")
    p.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (there is none either when stdout is not a terminal)")


def run(args: argparse.Namespace) -> int:
    from flatcake.replay.presets import get_preset

    preset = get_preset(args.preset)
    rates = _floats(args.rates) if args.rates else list(preset.rates)
    default = SYSTEMS if args.trace is not None else BUILTIN_SYSTEMS
    systems = _systems(args.systems) if args.systems else list(default)
    if args.trace is not None:
        return _run_one(args, preset, rates, systems, None, Path(args.out))
    kinds = _kinds(args.workload or ",".join(KINDS))
    if len(kinds) == 1:
        return _run_one(args, preset, rates, systems, kinds[0], Path(args.out))
    verdicts = []
    for i, kind in enumerate(kinds):
        print(f"== workload {i + 1}/{len(kinds)}: built-in {kind} ==")
        _run_one(args, preset, rates, systems, kind, Path(args.out) / kind, verdict=False)
        verdicts.append(kind)
    from flatcake.replay.results import load_result, verdict
    text = []
    for kind in verdicts:
        result = load_result(Path(args.out) / kind / "sweep.json")
        text += [f"built-in {kind} workload ({args.out}/{kind}/report.html):",
                 verdict(result), ""]
    (Path(args.out) / "verdict.txt").write_text("\n".join(text))
    print()
    print("\n".join(text).rstrip())
    return 0


def _run_one(args: argparse.Namespace, preset: ReplayPreset, rates: list[float],
             systems: list[str], kind: str | None, out: Path, verdict: bool = True) -> int:
    from flatcake.replay.plots import PLOTS, matplotlib_missing
    from flatcake.replay.results import verdict as verdict_table
    from flatcake.replay.sweep import run_sweep
    from flatcake.replay.workload.source import load_workload

    overrides: tuple[tuple[str, object], ...] = ()
    if args.routing:
        overrides = (("routing", args.routing),)
    start = time.perf_counter()
    wl, timings = load_workload(args.trace, format=args.format, sessions=args.sessions,
                                kind=kind or "agent", seed=args.seed,
                                block_tokens=args.block_tokens or preset.builtin_block_tokens,
                                context_tokens=args.context_tokens)
    print(wl.summary())
    result = run_sweep(wl, systems, rates, preset.name, str(out), seed=args.seed,
                       jobs=args.jobs,
                       progress=not args.quiet and progress.is_shown(), plots=not args.no_plots,
                       preset_overrides=overrides, cluster=cluster_spec(args),
                       meta={"load_timings": timings, "context_tokens": args.context_tokens,
                             "drive_bytes": drive_bytes(args)},
                       drive_bytes=drive_bytes(args))
    total = time.perf_counter() - start
    print(f"{len(result.runs)} runs on {result.meta['jobs']} processes: sweep "
          f"{result.meta['wall_s']:.1f} s, slowest run {result.meta['run_wall_s_max']:.1f} s "
          f"({result.meta['run_cpu_s_max']:.1f} s CPU), total {total:.1f} s")
    missing = None if args.no_plots else matplotlib_missing()
    print(f"wrote {out}/report.html (open it in a browser), sweep.md, sweep.csv, "
          f"sweep.json" + ("" if args.no_plots or missing else
                           ", " + ", ".join(name for name, _ in PLOTS)))
    if missing:
        print(f"no plots: {missing}")
    if verdict:
        print()
        print(verdict_table(result))
    return 0
