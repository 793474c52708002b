"""The replay report's ``deployments`` step: what one store per machine (``flatcake
serve``, every engine attached) gains over one private store per engine (the embedded
mode: each engine opens its own store).

    python -m flatcake.report --only deployments [--quick]

The Claude Code trace on the ``paper`` preset's node (8 data-parallel engines) at the
same offered load, the store shared or private, behind two routings:

* ``shared``: one store for the node: one index, host memory and SSD space for every
  engine (the preset as is);
* ``private``: each engine has its own store with an eighth of the node's host-memory
  and SSD budgets, and sees only the turns it ran;
* ``round robin``: requests spread over the engines in turn (vLLM's data parallelism, a
  load balancer in front of one server per GPU): a session's next turn usually lands on
  another engine;
* ``session-affine``: a session stays on one engine, so its history is in that engine's
  GPU prefix cache and store (shared: a new session goes to the engine with the fewest
  sessions, the node's ``session`` routing; private: a hash of the session picks the
  engine, as a stateless router in front of the servers does).

A private deployment is replayed as a cluster of one-engine nodes that share nothing
(``replay.cluster``), so its engines, GPU caches and SSD channels are the shared node's,
and round robin sends request ``k`` to the same engine in both. Results go to
``deployments/deployments.json`` and a Markdown table in ``report.md``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from flatcake.replay.cluster import ClusterSpec
from flatcake.replay.presets import ReplayPreset, get_preset
from flatcake.replay.sweep import SweepTask
from flatcake.replay.workload.trace import Workload
from flatcake.report.tasks import ratio, read_grid, run_tasks

RATES = (0.5, 1.0, 1.5)
QUICK_RATES = (1.0,)
SYSTEMS = ("flatcake",)
CLAUDE_CODE = "../shared/traces/weka-claude-code/weka_claude_code_traces.jsonl.gz"
ROUTINGS = (("round robin", "round_robin"), ("session-affine", "session"))
DEPLOYMENTS = tuple(f"{store}, {name}" for store in ("shared", "private") for name, _ in ROUTINGS)


def private_overrides(preset: ReplayPreset) -> tuple[tuple[str, Any], ...]:
    """One engine's node of a private deployment: one worker, its share of the node's
    host-memory and SSD budgets."""
    node = preset.node
    n = node.num_workers
    return (("num_workers", 1), ("host_memory_bytes", node.host_memory_bytes // n),
            ("ssd", dataclasses.replace(node.ssd, capacity_bytes=node.ssd.capacity_bytes // n)))


def tasks(wl_path: str, rates: tuple[float, ...], preset: str = "paper",
          systems: tuple[str, ...] = SYSTEMS) -> list[tuple[str, SweepTask]]:
    """(deployment, task) for every deployment, system and rate."""
    p = get_preset(preset)
    engines = p.node.num_workers
    private = private_overrides(p)
    out: list[tuple[str, SweepTask]] = []
    for s in systems:
        for r in rates:
            for name, routing in ROUTINGS:
                out.append((f"shared, {name}", SweepTask(wl_path, s, r, preset, 0,
                                                         (("routing", routing),))))
            for name, routing in ROUTINGS:
                out.append((f"private, {name}", SweepTask(
                    wl_path, s, r, preset, 0, private,
                    ClusterSpec(engines, routing, sharing=False))))
    return out


def run_deployments(workload: Workload, out_dir: Path, *, jobs: int | None = None,
                    quick: bool = False, preset: str = "paper",
                    systems: tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    """Every (deployment, system, rate) run; written to ``out_dir/deployments.json``
    and returned."""
    named: list[tuple[str, SweepTask]] = []

    def make(wl_path: str) -> list[SweepTask]:
        named.extend(tasks(wl_path, QUICK_RATES if quick else RATES, preset, systems))
        return [t for _, t in named]

    runs, jobs, wall = run_tasks(workload, out_dir, make, jobs)
    for (name, _), r in zip(named, runs, strict=True):
        r["deployment"] = name
    p = get_preset(preset)
    result = {"trace": workload.name, "preset": preset, "engines": p.node.num_workers,
              "host_memory_bytes": p.node.host_memory_bytes,
              "ssd_capacity_bytes": p.node.ssd.capacity_bytes, "systems": list(systems),
              "jobs": jobs, "wall_s": wall,
              "cpu_s": sum(r.get("cpu_s", 0.0) for r in runs),
              "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}
    (out_dir / "deployments.json").write_text(json.dumps(result, indent=1))
    return result


def deployments_table(result: dict[str, Any]) -> list[str]:
    """The report's section: per system and rate, each deployment's hit rate and TTFT,
    and what the shared store gains over each private one."""
    n = result["engines"]
    gib = 1024**3
    out = [f"## Deployments: one store per machine vs one per engine ({result['trace']}, "
           f"preset `{result['preset']}`)", "",
           f"{n} engines on one node. Shared: one store with the node's "
           f"{result['host_memory_bytes'] / gib:g} GiB of host memory and "
           f"{result['ssd_capacity_bytes'] / gib:g} GiB of SSD (`flatcake serve`). "
           f"Private: each engine's own store with 1/{n} of each (the embedded mode). "
           "Gain: the shared store against that private row, same routing (hit-rate "
           "points; mean TTFT, private / shared).", "",
           "| system | req/s | deployment | hit rate | max | mean TTFT (s) | P99 TTFT (s) "
           "| SSD GB read | gain of the shared store | load | CPU s |",
           "|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|"]
    runs = {(r["system"], r["rate_req_s"], r["deployment"]): r for r in result["runs"]}
    for s in result["systems"]:
        for rate in sorted({k[1] for k in runs if k[0] == s}):
            for name in DEPLOYMENTS:
                r = runs.get((s, rate, name))
                if r is None:
                    continue
                store, routing = name.split(", ")
                shared = runs.get((s, rate, f"shared, {routing}"))
                gain = "–"
                if store == "private" and shared is not None:
                    gain = (f"{100 * (shared['hit_rate_gpu'] - r['hit_rate_gpu']):+.2f} pt, "
                            f"{ratio(r['ttft_mean_s'], shared['ttft_mean_s'])} mean")
                out.append(
                    f"| {s} | {rate:g} | {name} | {100 * r['hit_rate_gpu']:.2f}% | "
                    f"{100 * r['max_hit_rate']:.2f}% | {r['ttft_mean_s']:.3f} | "
                    f"{r['ttft_p99_s']:.2f} | {r['ssd_read_bytes'] / 1e9:.1f} | {gain} | "
                    f"{r['load_status']} | {r['cpu_s']:.1f} |")
    out += ["", f"{len(result['runs'])} runs, {result['cpu_s']:.0f} CPU s in all on "
                f"{result['jobs']} processes ({result['date']}).", ""]
    return out


def load_deployments(out_dir: Path) -> dict[str, Any] | None:
    return read_grid(out_dir / "deployments.json")


def main(argv: list[str] | None = None) -> int:
    """``python -m flatcake.report.deployments``: this step alone, its table printed
    (and written for the docs site with ``--docs-out``)."""
    import argparse

    from flatcake import docsout
    from flatcake.replay.workload.source import load_workload

    ap = argparse.ArgumentParser(prog="python -m flatcake.report.deployments",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=CLAUDE_CODE,
                    help="trace file (default: the shared Claude Code trace)")
    ap.add_argument("--out", default="replay-report", help="folder of deployments/")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help=f"one rate ({QUICK_RATES[0]:g})")
    ap.add_argument("--docs-out", default=None, metavar="FILE",
                    help="also write the table for the docs site "
                         "(docs/results/generated/deployments.md)")
    args = ap.parse_args(argv)
    if not Path(args.trace).is_file():
        print(f"deployments: skipped, no trace at {args.trace}")
        return 0
    started = docsout.start()
    result = run_deployments(load_workload(args.trace)[0], Path(args.out) / "deployments",
                             jobs=args.jobs, quick=args.quick)
    table = "\n".join(deployments_table(result))
    print(table)
    if args.docs_out:
        docsout.write(args.docs_out, docsout.typed(ap.prog, argv), table, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
