"""The sweep writes its tables and plots, gives the same numbers on 1 or 2 processes,
and the CLI commands work end to end on the built-in workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flatcake.cli import main
from flatcake.replay.node.metrics import METRIC_COLUMNS
from flatcake.replay.results import load_result
from flatcake.replay.sweep import run_sweep
from flatcake.replay.workload.source import load_workload


def test_sweep_tables_plots_and_process_count_independence(tmp_path: Path) -> None:
    wl, _ = load_workload(None, sessions=4, seed=3)
    systems = ["flatcake", "tiered", "memory-only"]
    rates = [0.05, 0.2]
    one = run_sweep(wl, systems, rates, "paper", tmp_path / "one", jobs=1, progress=False)
    two = run_sweep(wl, systems, rates, "paper", tmp_path / "two", jobs=2, progress=False,
                    plots=False)
    assert len(one.runs) == 6
    timing = ("wall_s", "cpu_s")
    strip = [{k: v for k, v in r.items() if k not in timing} for r in one.runs]
    assert strip == [{k: v for k, v in r.items() if k not in timing} for r in two.runs]
    out = tmp_path / "one"
    for name in ("sweep.md", "sweep.csv", "sweep.json", "hit_rate.png", "ttft.png",
                 "prefetch.png", "read_amplification.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "sweep.md").read_text()
    assert "Hit rate delivered to the GPU" in md and "max (∞ cache)" in md
    header = (out / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header[:len(METRIC_COLUMNS)] == list(METRIC_COLUMNS)
    back = load_result(out / "sweep.json")
    assert back.meta["systems"] == systems
    assert [r["hit_rate_gpu"] for r in back.by("flatcake")] == [
        r["hit_rate_gpu"] for r in one.by("flatcake")]


def test_replay_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--sessions", "3", "--system", "tiered", "--rate", "0.1",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("hit_rate_gpu", "max_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s",
                "throughput_req_s", "throughput_tokens_s", "ssd_read_gbps_per_worker",
                "read_amplification", "read_commands", "prefetch_time_mean_s",
                "prefetch_time_p99_s", "prefetch_cancellations", "recomputed_tokens",
                "placements", "ssd_write_bytes", "ssd_read_bytes", "ssd_never_read_bytes",
                "drive_writes_per_day"):
        assert key in d
    assert d["system"] == "tiered"
    assert d["num_requests"] > 0


def test_replay_cli_rejects_bad_input(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    assert main(["replay", "--sessions", "2", "--rate", "-1"]) == 2
    assert "--rate" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["sweep", "--sessions", "2", "--systems", "nope", "--out",
                 str(tmp_path / "s")]) == 2
    assert "nope" in capsys.readouterr().err


def test_sweep_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["sweep", "--workload", "agent", "--sessions", "3", "--rates", "0.1",
                 "--systems", "flatcake,flatcake-1q", "--out", str(out), "--jobs", "1",
                 "--quiet", "--no-plots", "--drive-tb", "2"]) == 0
    text = capsys.readouterr().out
    assert "2 runs" in text
    data = json.loads((out / "sweep.json").read_text())
    assert {r["system"] for r in data["runs"]} == {"flatcake", "flatcake-1q"}
    # SSD wear, for the drive asked for: on the terminal, in every run, in the tables.
    assert "drive-writes a day on a 2 TB drive" in text
    run = data["runs"][0]
    assert run["drive_bytes"] == 2 * 10**12 and run["ssd_write_bytes"] > 0
    assert 0 <= run["ssd_never_read_bytes"] <= run["ssd_write_bytes"]
    assert run["drive_writes_per_day"] == pytest.approx(
        run["ssd_write_bytes"] / 2e12 / (run["simulated_s"] / 86400))
    md = (out / "sweep.md").read_text()
    assert "SSD written and never read (GB)" in md and "Drive-writes per day" in md


def test_sweep_cli_every_builtin_workload(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Without a trace the sweep covers agent, chat and mixed, one folder each, and the
    terminal ends with a verdict table per workload."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--sessions", "3", "--rates", "0.1", "--systems", "flatcake,tiered",
                 "--out", str(out), "--jobs", "1", "--quiet", "--no-plots"]) == 0
    text = capsys.readouterr().out
    for kind in ("agent", "chat", "mixed"):
        data = json.loads((out / kind / "sweep.json").read_text())
        assert {r["system"] for r in data["runs"]} == {"flatcake", "tiered"}
        assert f"generated-{kind}" in data["meta"]["trace"]
        assert f"built-in {kind} workload" in text
    assert (out / "verdict.txt").read_text().count("max hit rate") == 3
    assert main(["sweep", "--workload", "agent,nope", "--out", str(tmp_path / "x")]) == 2
    assert "nope" in capsys.readouterr().err


def test_sweep_without_the_plot_extra_writes_its_tables_and_says_how(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    out = tmp_path / "sweep"
    assert main(["sweep", "--workload", "agent", "--sessions", "3", "--rates", "0.1",
                 "--systems", "flatcake", "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "no plots: plots need matplotlib: pip install 'flatcake[plot]'" in text
    assert "Traceback" not in text and "hit_rate.png" not in text
    for name in ("sweep.md", "sweep.csv", "sweep.json", "report.html"):
        assert (out / name).is_file()
    assert not list(out.glob("*.png"))
