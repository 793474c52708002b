"""A sweep's results: every run's metrics and what produced them, read and written as
tables (Markdown, CSV, JSON). ``sweep`` fills one, ``plots`` and ``page`` draw it, the
report (``flatcake.report``) reads it back."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flatcake.replay.node.metrics import METRIC_COLUMNS


@dataclass(slots=True)
class SweepResult:
    """Every run of a sweep plus what produced it."""

    runs: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def by(self, system: str) -> list[dict[str, Any]]:
        return sorted((r for r in self.runs if r["system"] == system),
                      key=lambda r: r["rate_req_s"])


_PIVOTS: tuple[tuple[str, str, float, str], ...] = (
    ("hit_rate_gpu", "Hit rate delivered to the GPU (%)", 100.0, "{:.2f}"),
    ("ttft_mean_s", "Mean TTFT (s)", 1.0, "{:.3f}"),
    ("ttft_p99_s", "P99 TTFT (s)", 1.0, "{:.3f}"),
    ("prefetch_time_mean_s", "SSD prefetch time, mean (s)", 1.0, "{:.3f}"),
    ("prefetch_time_p99_s", "SSD prefetch time, P99 (s)", 1.0, "{:.3f}"),
    ("ssd_read_gbps_per_worker", "SSD read bandwidth per worker (GB/s)", 1.0, "{:.2f}"),
    ("read_amplification", "Read amplification (SSD bytes read / restored byte)", 1.0,
     "{:.2f}"),
    ("prefetch_cancellations", "Prefetches cancelled (recomputed)", 1.0, "{:.0f}"),
    ("throughput_req_s", "Throughput (req/s, steady window)", 1.0, "{:.3f}"),
    ("ssd_write_bytes", "SSD written (GB)", 1e-9, "{:,.1f}"),
    ("ssd_read_bytes", "SSD read back (GB)", 1e-9, "{:,.1f}"),
    ("ssd_never_read_bytes", "SSD written and never read (GB)", 1e-9, "{:,.1f}"),
    ("drive_writes_per_day", "Drive-writes per day (`--drive-tb`, default 4 TB)", 1.0,
     "{:.2f}"),
)


def _fmt(v: Any, pattern: str, scale: float) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return pattern.format(v * scale)


def markdown(result: SweepResult) -> str:
    """The sweep as Markdown: one pivot table per metric (rates x systems)."""
    meta = result.meta
    systems = meta["systems"]
    rates = meta["rates"]
    cell = {(r["system"], r["rate_req_s"]): r for r in result.runs}
    lines = [f"# Replay sweep: {meta['trace']} on preset `{meta['preset']}`", "",
             f"{meta['workload']}. Seed {meta['seed']}; {len(result.runs)} runs on "
             f"{meta['jobs']} processes in {meta['wall_s']:.0f} s (slowest run "
             f"{meta['run_wall_s_max']:.1f} s wall, {meta.get('run_cpu_s_max', 0.0):.1f} s "
             f"CPU).", ""]
    for key, title, scale, pattern in _PIVOTS:
        lines.append(f"## {title}")
        lines.append("")
        head = ["rate (req/s)", *systems]
        if key == "hit_rate_gpu":
            head.append("max (∞ cache)")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(["---:"] * len(head)) + "|")
        for rate in rates:
            row = [f"{rate:g}"]
            for s in systems:
                r = cell.get((s, rate))
                row.append(_fmt(r.get(key) if r else None, pattern, scale))
            if key == "hit_rate_gpu":
                any_run = next((cell[(s, rate)] for s in systems if (s, rate) in cell), None)
                row.append(_fmt(any_run["max_hit_rate"] if any_run else None, pattern, scale))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += load_table(result)
    placements = [r for r in result.runs if r.get("placements")]
    if placements:
        rules = sorted({k for r in placements for k in r["placements"]})
        lines.append("## FlatCake placements by rule (turns)")
        lines.append("")
        lines.append("| system | rate | " + " | ".join(rules) + " |")
        lines.append("|---|---:|" + "|".join(["---:"] * len(rules)) + "|")
        for r in placements:
            lines.append(f"| {r['system']} | {r['rate_req_s']:g} | " + " | ".join(
                str(r["placements"].get(k, 0)) for k in rules) + " |")
        lines.append("")
    return "\n".join(lines)


def load_table(result: SweepResult) -> list[str]:
    """Offered vs delivered rate, busy fractions and queues of every run (Markdown)."""
    lines = ["## Load: requested, offered, delivered; busy fractions; per-worker queue", "",
             "| system | requested | offered | delivered | status | GPU busy % | SSD busy % "
             "| queue mean | queue P99 |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for s in result.meta["systems"]:
        for r in result.by(s):
            lines.append(
                f"| {s} | {r['rate_req_s']:g} | {_fmt(r.get('offered_req_s'), '{:.3f}', 1)} | "
                f"{_fmt(r.get('throughput_req_s'), '{:.3f}', 1)} | "
                f"{r.get('load_status', '–')} | "
                f"{_fmt(r.get('gpu_busy_frac'), '{:.1f}', 100)} | "
                f"{_fmt(r.get('ssd_busy_frac'), '{:.1f}', 100)} | "
                f"{_fmt(r.get('queue_mean'), '{:.2f}', 1)} | "
                f"{_fmt(r.get('queue_p99'), '{:.0f}', 1)} |")
    lines.append("")
    return lines


def verdict(result: SweepResult) -> str:
    """The short table ``make demo`` ends with: per system, hit rate and mean / P99 TTFT
    at the lowest and the highest rate, and whether the node kept up there."""
    rates = sorted(result.meta["rates"])
    lo, hi = rates[0], rates[-1]
    head = (f"{'system':<14} {'hit% @' + format(lo, 'g'):>10} {'hit% @' + format(hi, 'g'):>10}"
            f" {'TTFT mean/P99 s @' + format(lo, 'g'):>22} "
            f"{'TTFT mean/P99 s @' + format(hi, 'g'):>22}  load @{hi:g}")
    lines = [head, "-" * len(head)]
    cell = {(r["system"], r["rate_req_s"]): r for r in result.runs}
    for s in result.meta["systems"]:
        a, b = cell.get((s, lo)), cell.get((s, hi))
        if a is None or b is None:
            continue
        def ttft(r: dict[str, Any]) -> str:
            return (f"{_fmt(r['ttft_mean_s'], '{:.2f}', 1)} / "
                    f"{_fmt(r['ttft_p99_s'], '{:.2f}', 1)}")
        lines.append(f"{s:<14} {_fmt(a['hit_rate_gpu'], '{:.2f}', 100):>10} "
                     f"{_fmt(b['hit_rate_gpu'], '{:.2f}', 100):>10} {ttft(a):>22} "
                     f"{ttft(b):>22}  {b.get('load_status', '–')} "
                     f"({_fmt(b.get('throughput_req_s'), '{:.2f}', 1)} req/s delivered)")
    any_run = next(iter(result.runs), None)
    if any_run is not None:
        lines.append(f"max hit rate (infinite cache): {100 * any_run['max_hit_rate']:.2f} %")
    lines += _wear_lines(result, cell, hi)
    return "\n".join(lines)


def _wear_lines(result: SweepResult, cell: dict[tuple[str, float], dict[str, Any]],
                rate: float) -> list[str]:
    """Per system at ``rate``: SSD GB written / read back / never read, drive-writes a
    day (runs from before these were measured have none)."""
    runs = [(s, cell[(s, rate)]) for s in result.meta["systems"] if (s, rate) in cell]
    runs = [(s, r) for s, r in runs if r.get("ssd_write_bytes") is not None]
    if not runs:
        return []
    drive = runs[0][1].get("drive_bytes", 0) / 1e12
    out = [f"SSD @{rate:g} req/s: written / read back / never read (GB), drive-writes a day "
           f"on a {drive:g} TB drive"]
    for s, r in runs:
        out.append(f"{s:<14} {_fmt(r['ssd_write_bytes'], '{:,.1f}', 1e-9)} / "
                   f"{_fmt(r.get('ssd_read_bytes'), '{:,.1f}', 1e-9)} / "
                   f"{_fmt(r.get('ssd_never_read_bytes'), '{:,.1f}', 1e-9)}  "
                   f"{_fmt(r.get('drive_writes_per_day'), '{:.2f}', 1)}")
    return out


def write_tables(result: SweepResult, out: Path) -> None:
    (out / "sweep.md").write_text(markdown(result))
    (out / "sweep.json").write_text(json.dumps({"meta": result.meta, "runs": result.runs},
                                               indent=1, sort_keys=True))
    rules = sorted({k for r in result.runs for k in (r.get("placements") or {})})
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*METRIC_COLUMNS, *(f"placement_{k}" for k in rules), "wall_s", "cpu_s"])
        for r in result.runs:
            w.writerow([r.get(c) for c in METRIC_COLUMNS]
                       + [(r.get("placements") or {}).get(k, 0) for k in rules]
                       + [f"{r['wall_s']:.2f}", f"{r.get('cpu_s', 0.0):.2f}"])


def load_result(path: str | Path) -> SweepResult:
    """Read a ``sweep.json`` back (e.g. to redraw plots)."""
    data = json.loads(Path(path).read_text())
    return SweepResult(data["runs"], data["meta"])
