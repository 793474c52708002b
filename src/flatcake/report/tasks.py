"""What the report's own grids share (``report.cluster``, ``report.deployments``): run a
list of sweep tasks over one saved workload on a process pool, compare two figures, read
a grid written earlier."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from flatcake.replay.sweep import SweepTask, run_task
from flatcake.replay.workload.trace import Workload


def run_tasks(workload: Workload, out_dir: Path, make: Callable[[str], list[SweepTask]],
              jobs: int | None) -> tuple[list[dict[str, Any]], int, float]:
    """Save ``workload`` in ``out_dir``, run the tasks ``make(path)`` builds on it (in
    their order) on ``jobs`` processes; returns each run's metrics in that order, the
    processes used and the wall seconds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wl_path = out_dir / "workload.npz"
    workload.save(wl_path)
    tasks = make(str(wl_path))
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    start = time.perf_counter()
    try:
        if jobs == 1:
            runs = [run_task(t) for t in tasks]
        else:
            with ProcessPoolExecutor(max_workers=jobs) as ex:
                runs = list(ex.map(run_task, tasks))
    finally:
        wl_path.unlink(missing_ok=True)
    return runs, jobs, time.perf_counter() - start


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.23x``, or a dash when it has no value."""
    return f"{a / b:.2f}x" if b > 0 and math.isfinite(a) and math.isfinite(b) else "–"


def read_grid(path: Path) -> dict[str, Any] | None:
    """A grid a step wrote earlier, ``None`` when there is none."""
    return json.loads(path.read_text()) if path.is_file() else None
