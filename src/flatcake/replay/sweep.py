"""``flatcake sweep``: a grid of (system, rate) replays on all cores, written as a table
(Markdown, CSV, JSON) and plots.

Each run is one process task that loads the workload from a small ``.npz`` (the
converted trace, a few MB) and replays it; nothing is shared between runs, so results do
not depend on the number of processes or the order they finish in.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flatcake import progress as progress_bars
from flatcake.replay.cluster import ClusterSpec, run_cluster
from flatcake.replay.node.metrics import DEFAULT_DRIVE_BYTES
from flatcake.replay.page import write_html
from flatcake.replay.plots import write_plots
from flatcake.replay.presets import get_preset
from flatcake.replay.results import SweepResult, write_tables
from flatcake.replay.simulate import replay_blocks, run_replay
from flatcake.replay.workload.trace import Workload

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SweepTask:
    """One (system, rate) run, as sent to a worker process."""

    workload_path: str
    system: str
    rate_req_s: float
    preset: str
    seed: int
    preset_overrides: tuple[tuple[str, Any], ...] = ()
    cluster: ClusterSpec | None = None
    drive_bytes: int = DEFAULT_DRIVE_BYTES


def run_task(task: SweepTask) -> dict[str, Any]:
    """Worker entry point: load the workload, replay, return the metrics as a dict."""
    wl = Workload.load(task.workload_path)
    preset = get_preset(task.preset)
    if task.preset_overrides:
        preset = preset.with_node(**dict(task.preset_overrides))
    if task.cluster is not None:
        m = run_cluster(wl, task.system, task.rate_req_s, preset, task.cluster, task.seed)
    else:
        m = run_replay(wl, task.system, task.rate_req_s, preset, task.seed)
    return replace(m, drive_bytes=task.drive_bytes).to_dict()


def run_sweep(workload: Workload, systems: Sequence[str], rates: Sequence[float],
              preset: str, out_dir: str | Path, *, seed: int = 0, jobs: int | None = None,
              progress: bool = True, plots: bool = True,
              preset_overrides: tuple[tuple[str, Any], ...] = (),
              meta: dict[str, Any] | None = None,
              cluster: ClusterSpec | None = None,
              drive_bytes: int = DEFAULT_DRIVE_BYTES) -> SweepResult:
    """Replay every (system, rate), write ``sweep.{md,csv,json}`` and plots in
    ``out_dir``, and return the results. ``cluster``: replay that cluster instead of
    one node (``replay.cluster``). ``drive_bytes``: the drive ``drive_writes_per_day``
    is stated for."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wl_path = out / "workload.npz"
    # Re-cut once here (a model whose entries span several trace blocks), not per run.
    base = get_preset(preset)
    if preset_overrides:
        base = base.with_node(**dict(preset_overrides))
    workload = replay_blocks(workload, base)[0]
    workload.save(wl_path)
    tasks = [SweepTask(str(wl_path), s, float(r), preset, seed, preset_overrides, cluster,
                       drive_bytes) for s in systems for r in rates]
    # Slow runs first (FlatCake plans reads, high rates restore more) for better packing.
    tasks.sort(key=lambda t: (not t.system.startswith("flatcake"), -t.rate_req_s))
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    bar = _progress(len(tasks), progress)
    try:
        if jobs == 1:
            for t in tasks:
                runs.append(run_task(t))
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as ex:
                futures = [ex.submit(run_task, t) for t in tasks]
                for f in as_completed(futures):
                    runs.append(f.result())
                    bar.update(1)
    finally:
        bar.close()
    wall = time.perf_counter() - start
    runs.sort(key=lambda r: (list(systems).index(r["system"]), r["rate_req_s"]))
    info = {
        "trace": workload.name,
        "workload": workload.summary(),
        "preset": preset,
        "preset_overrides": [list(kv) for kv in preset_overrides],
        "systems": list(systems),
        "rates": [float(r) for r in rates],
        "seed": seed,
        "jobs": jobs,
        "wall_s": wall,
        "run_wall_s_max": max((r["wall_s"] for r in runs), default=0.0),
        "run_cpu_s_max": max((r.get("cpu_s", 0.0) for r in runs), default=0.0),
        "assumptions": list(get_preset(preset).assumptions),
        **({"cluster": dataclasses.asdict(cluster)} if cluster is not None else {}),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **(meta or {}),
    }
    result = SweepResult(runs, info)
    write_tables(result, out)
    wl_path.unlink(missing_ok=True)
    write_html(result, out, write_plots(result, out) if plots else ())
    return result


def _progress(total: int, enabled: bool) -> progress_bars.Bar:
    with progress_bars.shown(enabled):
        return progress_bars.task("replay runs", total, "run")


# ------------------------------------------------------------------------- tables
