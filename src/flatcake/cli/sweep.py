"""``flatcake sweep``: the (system x rate) grid on all cores, as tables and plots."""

from __future__ import annotations

import argparse
import time

from flatcake import progress
from flatcake.cli.replay import add_workload_args
from flatcake.replay.presets import PRESETS
from flatcake.replay.systems import ALL_SYSTEMS, SYSTEMS

DESCRIPTION = ("Replay a trace (default: the built-in agent workload) for each system at "
               "each request rate, on all cores, and write sweep.md, sweep.csv, sweep.json, "
               "plots and report.html to --out.")


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


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_args(p)
    p.add_argument("--rates", default=None,
                   help="comma-separated request rates (default: the preset's; " + "; ".join(
                       f"{name}: {','.join(f'{r:g}' for r in pr.rates)}"
                       for name, pr in sorted(PRESETS.items())) + ")")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated systems (default: {','.join(SYSTEMS)})")
    p.add_argument("--out", default="replay-sweep", help="output directory")
    p.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (there is none either when stdout is not a terminal)")


def run(args: argparse.Namespace) -> int:
    from flatcake.replay.load import load_workload
    from flatcake.replay.presets import get_preset
    from flatcake.replay.sweep import run_sweep, verdict

    preset = get_preset(args.preset)
    rates = _floats(args.rates) if args.rates else list(preset.rates)
    systems = _systems(args.systems)
    overrides: tuple[tuple[str, object], ...] = ()
    if args.routing:
        overrides = (("routing", args.routing),)
    start = time.perf_counter()
    wl, timings = load_workload(args.trace, format=args.format, sessions=args.sessions,
                                kind=args.workload, seed=args.seed,
                                block_tokens=args.block_tokens or preset.builtin_block_tokens,
                                context_tokens=args.context_tokens)
    print(wl.summary())
    result = run_sweep(wl, systems, rates, preset.name, args.out, seed=args.seed,
                       jobs=args.jobs,
                       progress=not args.quiet and progress.is_shown(), plots=not args.no_plots,
                       preset_overrides=overrides,
                       meta={"load_timings": timings, "context_tokens": args.context_tokens})
    total = time.perf_counter() - start
    print(f"{len(result.runs)} runs on {result.meta['jobs']} processes: sweep "
          f"{result.meta['wall_s']:.1f} s, slowest run {result.meta['run_wall_s_max']:.1f} s "
          f"({result.meta['run_cpu_s_max']:.1f} s CPU), total {total:.1f} s")
    print(f"wrote {args.out}/report.html (open it in a browser), sweep.md, sweep.csv, "
          f"sweep.json" + ("" if args.no_plots else ", hit_rate.png, ttft.png, prefetch.png, "
                                                    "read_amplification.png"))
    print()
    print(verdict(result))
    return 0
