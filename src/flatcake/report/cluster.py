"""The replay report's ``cluster`` step: what sharing KV across nodes gains.

    python -m flatcake.report --only cluster [--quick]

The Claude Code trace on 2, 4 and 8 nodes of the ``paper`` preset at the same load
per node (``RATE_PER_NODE``; the cluster's rate is that times the node count), for
``flatcake`` and ``tiered-direct`` (the best tiered baseline on this trace), each
under three settings: session-affine routing with sharing, round-robin routing with
sharing, and round-robin routing without it (a node sees only its own store). The
one-node replay at the same per-node rate is the reference row. Results go to
``cluster/cluster.json`` and a Markdown table in ``report.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flatcake.replay.cluster import ClusterSpec
from flatcake.replay.sweep import SweepTask
from flatcake.replay.workload.trace import Workload
from flatcake.report.tasks import ratio, read_grid, run_tasks

NODE_COUNTS = (2, 4, 8)
RATE_PER_NODE = 0.5
SYSTEMS = ("flatcake", "tiered-direct")
CASES: tuple[tuple[str, bool], ...] = (("session", True), ("round_robin", True),
                                       ("round_robin", False))
_CASE_NAMES = {("session", True): "session-affine, shared",
               ("round_robin", True): "round robin, shared",
               ("round_robin", False): "round robin, not shared"}


def run_grid(workload: Workload, out_dir: Path, *, jobs: int | None = None,
             quick: bool = False) -> dict[str, Any]:
    """Every (nodes, system, case) run plus the one-node reference; written to
    ``out_dir/cluster.json`` and returned."""
    counts = (2, 8) if quick else NODE_COUNTS

    def make(wl_path: str) -> list[SweepTask]:
        tasks = [SweepTask(wl_path, s, RATE_PER_NODE, "paper", 0) for s in SYSTEMS]
        tasks += [SweepTask(wl_path, s, RATE_PER_NODE * n, "paper", 0,
                            cluster=ClusterSpec(n, routing, sharing))
                  for n in counts for s in SYSTEMS for routing, sharing in CASES]
        return sorted(tasks, key=lambda t: -(t.cluster.nodes if t.cluster else 1))  # big first

    runs, jobs, wall = run_tasks(workload, out_dir, make, jobs)
    result = {"trace": workload.name, "rate_per_node": RATE_PER_NODE,
              "node_counts": list(counts), "systems": list(SYSTEMS), "jobs": jobs,
              "wall_s": wall,
              "cpu_s": sum(r.get("cpu_s", 0.0) for r in runs),
              "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}
    (out_dir / "cluster.json").write_text(json.dumps(result, indent=1))
    return result


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    status = "" if r["load_status"] == "ok" else f" ({r['load_status']})"
    return (f"{100 * r['hit_rate_gpu']:.2f} · {r['ttft_mean_s']:.3f} / "
            f"{r['ttft_p99_s']:.2f}{status}")


def _key(r: dict[str, Any]) -> tuple[int, str, str, bool]:
    ex = r.get("extra") or {}
    return (int(ex.get("nodes", 1)), r["system"], str(ex.get("node_routing", "-")),
            bool(ex.get("sharing", False)))


def cluster_table(result: dict[str, Any]) -> list[str]:
    """The report's section: per node count and system, the three settings and the
    gain of sharing under round-robin routing."""
    runs = {_key(r): r for r in result["runs"]}
    rpn = result["rate_per_node"]
    out = [f"## Cluster: KV shared across nodes (Claude Code trace, {rpn:g} req/s per "
           "node, preset `paper`)", "",
           "Cells: hit rate (%) · mean / P99 TTFT (s). Gain: round robin with sharing "
           "against without (hit-rate points; mean and P99 TTFT, without / with).", "",
           "| nodes | system | " + " | ".join(_CASE_NAMES[c] for c in CASES)
           + " | gain of sharing | remote GB read | CPU s |",
           "|---:|---|" + "---:|" * (len(CASES) + 3)]
    for s in result["systems"]:
        one = runs.get((1, s, "-", False))
        if one is not None:
            out.append(f"| 1 | {s} | {_cell(one)} | – | – | – | – | {one['cpu_s']:.1f} |")
    for n in result["node_counts"]:
        for s in result["systems"]:
            cells = [runs.get((n, s, routing, sharing)) for routing, sharing in CASES]
            shared, alone = cells[1], cells[2]
            gain = "–"
            remote = "–"
            if shared is not None and alone is not None:
                gain = (f"+{100 * (shared['hit_rate_gpu'] - alone['hit_rate_gpu']):.2f} pt, "
                        f"{ratio(alone['ttft_mean_s'], shared['ttft_mean_s'])} mean, "
                        f"{ratio(alone['ttft_p99_s'], shared['ttft_p99_s'])} P99")
                ex = shared.get("extra") or {}
                nbytes = ex.get("remote_memory_bytes", 0) + ex.get("remote_ssd_bytes", 0)
                remote = f"{nbytes / 1e9:.0f}"
            cpu = " / ".join(f"{c['cpu_s']:.1f}" if c else "–" for c in cells)
            out.append(f"| {n} | {s} | " + " | ".join(_cell(c) for c in cells)
                       + f" | {gain} | {remote} | {cpu} |")
    out += ["", f"{len(result['runs'])} runs, {result['cpu_s']:.0f} CPU s in all on "
                f"{result['jobs']} processes ({result['date']}). CPU s per run: the three "
                "settings in column order.", ""]
    return out


def load_grid(out_dir: Path) -> dict[str, Any] | None:
    return read_grid(out_dir / "cluster.json")
