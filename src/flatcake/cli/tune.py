"""``flatcake tune``: placement thresholds and the spare-memory watermark, searched by
replay on one part of the user's trace and checked on the part held back."""

from __future__ import annotations

import argparse
import json
import time

DESCRIPTION = ("Search the [placement] thresholds (agent context, long and short reply) and "
               "memory_copy_watermark by replaying FlatCake on part of TRACE (a session "
               "split, or the first part in time), within a CPU-second budget, on all "
               "cores; check the best and the defaults on the held-back part; print the best "
               "as a TOML snippet for the store, the vLLM connector and "
               "'flatcake replay --config'.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flatcake.cli.replay import add_workload_args
    from flatcake.tune import GRID

    add_workload_args(p)
    p.add_argument("--rates", default=None,
                   help="comma-separated request rates to score at (default: the lowest, "
                        "middle and highest of the preset's)")
    p.add_argument("--budget-cpu-s", type=float, default=1000.0,
                   help="replay CPU seconds the search and the held-back check may spend "
                        "(default 1000; reading the trace and starting processes come on "
                        "top)")
    p.add_argument("--holdout", type=float, default=0.5,
                   help="share of the sessions (or of the trace's time) held back to check "
                        "the result (default 0.5)")
    p.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--config", default=None,
                   help="start from this TOML config's [placement] instead of the defaults")
    p.add_argument("--toml", default=None, metavar="FILE",
                   help="also write the [placement] snippet to FILE: the starting one at "
                        "once (a usable file even if the search is stopped), the best at "
                        "the end")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.epilog = "knobs and values tried: " + "; ".join(
        f"{k} {', '.join(f'{v:g}' for v in vals)}" for k, vals in GRID.items())


def run(args: argparse.Namespace) -> int:
    from flatcake.cli.sweep import _floats
    from flatcake.config import PlacementConfig, load_config
    from flatcake.replay.presets import get_preset
    from flatcake.replay.workload.source import load_workload
    from flatcake.tune import Score, toml_snippet, tune

    preset = get_preset(args.preset)
    if args.rates:
        rates = _floats(args.rates)
    else:
        r = sorted(preset.rates)
        rates = sorted({r[0], r[len(r) // 2], r[-1]})
    start_cfg = load_config(args.config, env={}) if args.config else None
    wl, _ = load_workload(args.trace, format=args.format, sessions=args.sessions,
                          kind=args.workload, seed=args.seed,
                          block_tokens=args.block_tokens or preset.builtin_block_tokens,
                          context_tokens=args.context_tokens)
    if args.toml:
        _write(args.toml, toml_snippet(start_cfg.placement if start_cfg else PlacementConfig()))
    t0 = time.perf_counter()
    res = tune(wl, preset.name, rates, budget_cpu_s=args.budget_cpu_s, holdout=args.holdout,
               seed=args.seed, jobs=args.jobs,
               default=start_cfg.placement if start_cfg else None)
    wall = time.perf_counter() - t0
    if args.toml:
        _write(args.toml, toml_snippet(res.best))

    def row(s: Score) -> dict[str, float]:
        return {"hit_rate": s.hit_rate, "ttft_mean_s": s.ttft_mean_s, "cpu_s": s.cpu_s}

    if args.json:
        import dataclasses

        print(json.dumps({
            "trace": wl.name, "preset": preset.name, "rates": rates,
            "best": dataclasses.asdict(res.best), "default": dataclasses.asdict(res.default),
            "tune": {"default": row(res.tune_default), "best": row(res.tune_best)},
            "held_back": {"default": row(res.holdout_default), "best": row(res.holdout_best)},
            "candidates": len(res.tried), "cpu_s": res.cpu_s, "wall_s": wall,
            "budget_hit": res.budget_hit}, indent=1, sort_keys=True))
        return 0
    print(wl.summary())
    print(f"preset {preset.name}, rates {', '.join(f'{r:g}' for r in rates)} req/s; "
          f"{len(res.tried)} placements tried, {res.cpu_s:.0f} CPU s of replay in "
          f"{wall:.0f} s" + (" (budget reached)" if res.budget_hit else ""))
    print("                      hit rate (mean)   TTFT mean (s)")
    for label, s in (("tuning part, default", res.tune_default),
                     ("tuning part, best", res.tune_best),
                     ("held back, default", res.holdout_default),
                     ("held back, best", res.holdout_best)):
        print(f"  {label:<20} {100 * s.hit_rate:>12.3f}%   {s.ttft_mean_s:>12.4f}")
    gain = res.holdout_best.hit_rate - res.holdout_default.hit_rate
    speed = res.holdout_default.ttft_mean_s / res.holdout_best.ttft_mean_s \
        if res.holdout_best.ttft_mean_s else float("nan")
    print(f"held back: {100 * gain:+.3f} points of hit rate, TTFT x{1 / speed:.3f} of the "
          f"default's" if res.best != res.default else
          "held back: the defaults were best; nothing to change")
    print()
    print(toml_snippet(res.best))
    return 0


def _write(path: str, snippet: str) -> None:
    with open(path, "w") as fh:
        fh.write(snippet + "\n")
