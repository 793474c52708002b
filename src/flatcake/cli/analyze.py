"""``flatcake analyze [TRACE]``: reuse statistics and placement advice for a trace.

Without TRACE it analyses the built-in generated workload (``--workload``), the same
one the replay simulator uses by default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import resource
import sys
import time
from typing import TYPE_CHECKING

from flatcake import progress
from flatcake.config import GIB, FlatCakeConfig, load_config
from flatcake.geometry import PRESETS, preset
from flatcake.traces.generator import WORKLOAD_KINDS, WorkloadSpec
from flatcake.traces.recommend import DEFAULT_SSD_READ_GBPS
from flatcake.traces.source import FORMATS

if TYPE_CHECKING:
    from flatcake.traces.analyze import TraceAnalysis
    from flatcake.traces.model import Trace
    from flatcake.traces.recommend import Recommendation

logger = logging.getLogger(__name__)

# Printed in this order; the first block is the metric set.
_ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "{:,}"),
    ("block_accesses", "{:,}"),
    ("unique_blocks", "{:,}"),
    ("share_blocks_used_once", "{:.2%}"),
    ("max_prefix_hit_rate", "{:.2%}"),
    ("max_prefix_hit_rate_tokens", "{:.2%}"),
    ("reuse_distance_requests_median", "{:,.0f}"),
    ("reuse_distance_requests_p90", "{:,.0f}"),
    ("reuse_gap_seconds_median", "{:,.0f}"),
    ("reuse_gap_seconds_p90", "{:,.0f}"),
    ("input_tokens_mean", "{:,.0f}"),
    ("input_tokens_median", "{:,.0f}"),
    ("input_tokens_p99", "{:,.0f}"),
    ("output_tokens_mean", "{:,.0f}"),
    ("time_span_s", "{:,.0f}"),
    ("sessions", "{:,}"),
    ("subagents", "{:,}"),
    ("turns_per_session_mean", "{:,.1f}"),
    ("session_context_tokens_mean", "{:,.0f}"),
    ("session_context_tokens_p99", "{:,.0f}"),
    ("session_kv_bytes_mean", "bytes"),
    ("session_kv_bytes_p99", "bytes"),
    ("inter_request_gap_seconds_median", "{:,.0f}"),
    ("inter_request_gap_seconds_p90", "{:,.0f}"),
    ("think_time_seconds_median", "{:,.1f}"),
    ("new_blocks_per_request_mean", "{:,.1f}"),
    ("context_growth_blocks_per_turn_mean", "{:,.1f}"),
    ("share_sessions_with_reset", "{:.1%}"),
    ("blocks_shared_across_sessions", "{:,}"),
)


DESCRIPTION = ("Measure KV reuse in a request trace (or the built-in workload) and say "
               "what it means for memory, SSD and placement.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", help="trace file (plain or .gz); default: the "
                   "built-in generated workload")
    p.add_argument("--format", choices=FORMATS, help="trace format (default: detected)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines (counted and reported) instead of failing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--model", default=None,
                   help=f"geometry preset for KV bytes, one of {sorted(PRESETS)} "
                        "(default: the config's model)")
    p.add_argument("--config", help="FlatCake TOML config (memory budget, placement)")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="host memory for KV in GiB (default: store.memory_capacity_bytes)")
    p.add_argument("--memory-sessions", type=int, default=16,
                   help="sessions memory should hold at once (sets the suggested "
                        "agent_context_threshold_tokens; default 16)")
    p.add_argument("--ssd-gbps", type=float, default=DEFAULT_SSD_READ_GBPS,
                   help="SSD read GB/s per worker for restore-time estimates")
    p.add_argument("--rate", type=float, default=None,
                   help="req/s for the expected SSD wear (default: the trace's own span)")
    p.add_argument("--drive-tb", type=float, default=4.0,
                   help="state drive-writes per day for an SSD of this many TB (default 4)")
    p.add_argument("--plot", metavar="PNG", help="write reuse-distance and session-size plots")
    p.add_argument("--save", metavar="PATH",
                   help="also write the trace in FlatCake's native format (.jsonl[.gz])")
    p.add_argument("--timing", action="store_true",
                   help="print read and analysis time and peak memory (to stderr)")
    g = p.add_argument_group("built-in workload (without TRACE)")
    g.add_argument("--workload", choices=WORKLOAD_KINDS, default="agent")
    g.add_argument("--sessions", type=int, default=WorkloadSpec().num_sessions)
    g.add_argument("--chat-share", type=float, default=WorkloadSpec().chat_share)
    g.add_argument("--seed", type=int, default=0)


def _load(args: argparse.Namespace) -> Trace:
    from flatcake.traces.generator import generate_workload
    from flatcake.traces.load import read_trace

    if args.trace:
        return read_trace(args.trace, format=args.format, skip_bad=args.skip_bad)
    spec = WorkloadSpec(kind=args.workload, num_sessions=args.sessions,
                        chat_share=args.chat_share, seed=args.seed)
    return generate_workload(spec)


def run(args: argparse.Namespace) -> int:
    from flatcake.traces.analyze import analyze_trace
    from flatcake.traces.recommend import recommend

    cfg: FlatCakeConfig = load_config(args.config) if args.config else FlatCakeConfig()
    geometry = preset(args.model or cfg.model)
    memory_bytes = (int(args.memory_gib * GIB) if args.memory_gib is not None
                    else cfg.store.memory_capacity_bytes)
    start = time.perf_counter()
    trace = _load(args)
    read_s = time.perf_counter() - start
    read_peak = _peak_rss_bytes()
    if progress.is_shown():  # one vectorised pass: no steps to count, so say what runs
        print(f"analysing {trace.summary()} ...", file=sys.stderr, flush=True)
    analysis = analyze_trace(trace, geometry)
    analyze_s = time.perf_counter() - start - read_s
    logger.info("read %.1f s, analysed %.1f s", read_s, analyze_s)
    if args.timing:
        print(f"timing: read {read_s:.2f} s (peak RSS {read_peak / GIB:.2f} GiB), "
              f"analyze {analyze_s:.2f} s (peak RSS {_peak_rss_bytes() / GIB:.2f} GiB)",
              file=sys.stderr)
    advice = recommend(analysis, geometry, memory_bytes, cfg.placement,
                       memory_sessions=args.memory_sessions, ssd_read_gbps=args.ssd_gbps)
    if args.save:
        from flatcake.traces.readers.native import write_native

        write_native(trace, args.save)
    if args.plot:
        from flatcake.traces.plot import plot_analysis

        plot_analysis(analysis, args.plot)
    from flatcake.traces.wear import expected_wear

    if args.drive_tb <= 0 or (args.rate is not None and args.rate <= 0):
        raise ValueError(f"--drive-tb and --rate must be > 0, got {args.drive_tb}, "
                         f"{args.rate}")
    wear = expected_wear(analysis.stats, geometry, round(args.drive_tb * 1e12), args.rate)
    if args.json:
        out = analysis.stats.to_dict()
        out["recommendation"] = advice.to_dict()
        out["expected_ssd_wear"] = dataclasses.asdict(wear) if wear is not None else None
        out["skipped_examples"] = list(trace.skipped_examples)
        print(json.dumps(out, indent=1))
    else:
        print(format_report(trace, analysis, advice))
        if wear is not None:
            print(f"\nexpected SSD wear ({analysis.stats.model}): {wear.line()}")
        if args.plot:
            print(f"\nplot written to {args.plot}")
        if args.save:
            print(f"trace written to {args.save}")
    return 0


def _peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def format_report(trace: Trace, analysis: TraceAnalysis, advice: Recommendation) -> str:
    st = analysis.stats.to_dict()
    lines = [f"trace: {trace.summary()}"]
    if trace.num_skipped_lines:
        lines.append(f"skipped {trace.num_skipped_lines} malformed lines (--skip-bad), e.g.:")
        lines += [f"  {e}" for e in trace.skipped_examples]
    if not trace.has_hashes:
        lines.append("no block hashes: prefix statistics (reuse, hit rate, distances) are "
                     "unavailable for this trace")
    width = max(len(k) for k, _ in _ROWS)
    for key, fmt in _ROWS:
        value = st[key]
        if value is None:
            continue
        text = f"{value / GIB:,.2f} GiB ({analysis.stats.model})" if fmt == "bytes" \
            else fmt.format(value)
        lines.append(f"  {key:<{width}}  {text}")
    lines.append("")
    lines.append("recommendation:")
    lines += [f"  - {line}" for line in advice.lines]
    lines.append("  config:  [placement] " + ", ".join(
        f"{k} = {v}" for k, v in advice.placement.items()))
    return "\n".join(lines)
