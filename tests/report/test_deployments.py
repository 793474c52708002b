"""The report's deployments step: one store per machine against one private store per
engine, each private engine with its share of the node's budgets, the table naming
every deployment and the gain of the shared store."""

from __future__ import annotations

from pathlib import Path

from flatcake.replay.presets import get_preset
from flatcake.replay.workload.source import load_workload
from flatcake.report import deployments


def test_a_private_engine_gets_its_share_of_the_node() -> None:
    paper = get_preset("paper")
    over = dict(deployments.private_overrides(paper))
    n = paper.node.num_workers
    assert over["num_workers"] == 1
    assert over["host_memory_bytes"] * n == paper.node.host_memory_bytes
    assert over["ssd"].capacity_bytes * n == paper.node.ssd.capacity_bytes
    assert over["ssd"].read_bytes_per_s == paper.node.ssd.read_bytes_per_s
    named = deployments.tasks("wl.npz", (1.0,))
    assert [name for name, _ in named] == list(deployments.DEPLOYMENTS) == [
        "shared, round robin", "shared, session-affine", "private, round robin",
        "private, session-affine"]
    shared_rr, shared_affine, rr, affine = (t for _, t in named)
    assert shared_rr.cluster is None and shared_rr.preset_overrides == (("routing",
                                                                         "round_robin"),)
    assert shared_affine.cluster is None and dict(shared_affine.preset_overrides) == {
        "routing": "session"}
    assert (rr.cluster.nodes, rr.cluster.routing, rr.cluster.sharing) == (n, "round_robin",
                                                                          False)
    assert affine.cluster.routing == "session" and not affine.cluster.sharing


def test_the_shared_store_serves_what_private_stores_behind_round_robin_miss(
        tmp_path: Path) -> None:
    wl = load_workload(None, kind="agent", sessions=8)[0]
    result = deployments.run_deployments(wl, tmp_path / "deployments", jobs=1, quick=True)
    assert deployments.load_deployments(tmp_path / "deployments") is not None
    runs = {r["deployment"]: r for r in result["runs"]}
    assert set(runs) == set(deployments.DEPLOYMENTS)
    # Private stores see only their engine's turns: round robin sends a session's next
    # turn to an engine whose store never saw its history.
    assert (runs["shared, round robin"]["hit_rate_gpu"]
            > runs["private, round robin"]["hit_rate_gpu"])
    assert runs["private, round robin"]["extra"]["nodes"] == get_preset("paper").node.num_workers
    assert all(r["num_requests"] == wl.num_requests for r in runs.values())
    rows = [line for line in deployments.deployments_table(result) if line.startswith("| flatcake")]
    assert [row.split(" | ")[2] for row in rows] == list(deployments.DEPLOYMENTS)
    assert [row.split(" | ")[8] == "–" for row in rows] == [True, True, False, False]
    assert " pt, " in rows[2] and " pt, " in rows[3]


def test_no_trace_is_a_skip_not_an_error(tmp_path: Path, capsys: object) -> None:
    assert deployments.main(["--trace", str(tmp_path / "absent.jsonl"),
                             "--out", str(tmp_path)]) == 0
    assert "skipped" in capsys.readouterr().out  # type: ignore[attr-defined]
