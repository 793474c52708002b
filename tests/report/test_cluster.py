"""The report's cluster step: every node count and setting tabulated, sharing's remote
reads counted, the grid read back as written."""

from __future__ import annotations

import json
from pathlib import Path

from flatcake.replay.workload.source import load_workload
from flatcake.report import cluster as cluster_step


def test_report_step_tabulates_every_node_count_and_setting(tmp_path: Path) -> None:
    wl = load_workload(None, kind="agent", sessions=4)[0]
    out = tmp_path / "cluster"
    grid = cluster_step.run_grid(wl, out, jobs=1, quick=True)
    assert cluster_step.load_grid(out) == json_roundtrip(grid)
    lines = cluster_step.cluster_table(grid)
    rows = [line for line in lines if line.startswith("| ")]
    assert [r.split(" | ")[:2] for r in rows[1:]] == [
        ["| 1", "flatcake"], ["| 1", "tiered-direct"], ["| 2", "flatcake"],
        ["| 2", "tiered-direct"], ["| 8", "flatcake"], ["| 8", "tiered-direct"]]
    shared = [r for r in grid["runs"] if (r["extra"].get("node_routing") == "round_robin"
                                          and r["extra"]["sharing"])]
    assert shared and all(r["extra"]["remote_blocks"] > 0 for r in shared)


def json_roundtrip(d: object) -> object:
    return json.loads(json.dumps(d))
