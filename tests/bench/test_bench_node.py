"""``flatcake bench --node --quick`` end to end: the node service's rows run
and report; every restored byte is compared; both halves' call costs are there. Timings
are printed by the bench, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.bench.node import NodeBenchOptions
from flatcake.cli import main
from flatcake.geometry import preset


def test_node_rows_run_and_report(direct_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path_factory.mktemp("docs") / "node.md"
    assert main(["bench", "--node", "--quick", "--dir", str(direct_dir), "--json",
                 "--docs-out", str(md)]) == 0
    doc = json.loads(capsys.readouterr().out)
    g = preset(doc["model"])
    everything = doc["sessions"] * doc["blocks"] * g.num_layers * g.block_bytes_per_layer
    assert [r["processes"] for r in doc["restores"]] == [1, 2]
    for row in doc["restores"]:
        # Every session restored whole by each shape, byte for byte.
        assert row["verified"] is True and row["bytes_restored"] == everything
        assert row["gbps"] > 0 and len(row["gbps_runs"]) == doc["rounds"]
    costs = {(c["call"], c["half"]): c for c in doc["costs"]}
    assert set(costs) == {(call, half) for call in ("lookup of 2048 blocks", "empty step")
                          for half in ("embedded", "node service")}
    assert all(c["cpu_us"] >= 0 and c["wall_us"] > 0 for c in costs.values())
    bars = {b["name"]: b for b in doc["bars"]}
    assert bars["every restored byte equal"]["passed"] is True
    assert "restore GB/s, 2 processes / 1 process" in bars
    assert any(n.startswith("1-minute load average") for n in doc["notes"])
    assert "--node" in doc["command"] and "--clients 2" in doc["command"]
    assert list(direct_dir.iterdir()) == []  # the bench's files are gone
    # The docs' tables, under the command that wrote them.
    text = md.read_text()
    assert text.startswith("<!-- written by: flatcake bench --node ")
    assert "--docs-out" in text.splitlines()[0]
    assert "| 2 attached processes |" in text and "| every restored byte equal |" in text


def test_more_clients_than_sessions_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--sessions 2 is fewer than --clients 4"):
        NodeBenchOptions(directory=".", clients=4, sessions=2)
    with pytest.raises(ValueError, match="--blocks must be an int >= 1"):
        NodeBenchOptions(directory=".", blocks=0)


def test_the_text_report_shows_rows_bars_and_notes() -> None:
    from flatcake.bench.node import CallCost, NodeBenchReport, RestoreRow, format_node_table
    from flatcake.bench.report import Bar

    report = NodeBenchReport(
        "flatcake bench --node", "llama-3.1-8b", 2, 4, 1 << 23, 1, 20,
        (RestoreRow(1, 1.0, (1.0,), 0.2, 16 << 20, True),
         RestoreRow(2, 1.5, (1.5,), 0.3, 16 << 20, False)),
        (CallCost("empty step", "node service", 1.25, 1.5),),
        (Bar("restore GB/s, 2 processes / 1 process", 1.5, ">=", 0.9),), 3.0, ("load 1.0",))
    text = format_node_table(report)
    assert "2 attached processes" in text and " NO" in text
    assert "empty step               node service       1.25" in text
    assert "bar PASS: restore GB/s, 2 processes / 1 process: 1.500 >= 0.9" in text
    assert text.endswith("note: load 1.0\nelapsed 3.0 s")
