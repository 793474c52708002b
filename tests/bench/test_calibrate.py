"""``flatcake bench --calibrate``: the plumbing from a measurement on the disk at hand to
the ``local`` replay preset (never the timings themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.bench import calibrate
from flatcake.bench.calibrate import RestoreCosts, fit_costs, measure_restore_costs
from flatcake.cli import main
from flatcake.replay import calibration


def test_fit_separates_the_fixed_cost_from_commands_and_bytes() -> None:
    # 1 ms fixed, 50 us per command, 10 us per block's bytes, 9 commands.
    one = 1e-3 + 50e-6 + 10e-6
    few = 1e-3 + 50e-6 + 9 * 10e-6
    many = 1e-3 + 9 * 50e-6 + 9 * 10e-6
    overhead, command = fit_costs(one, few, many, 9)
    assert overhead == pytest.approx(1e-3)
    assert command == pytest.approx(50e-6)


def test_fit_clamps_noise_to_zero_and_rejects_bad_input() -> None:
    assert fit_costs(1e-3, 1e-3, 0.5e-3, 4) == (pytest.approx(1e-3), 0.0)
    with pytest.raises(ValueError, match="commands"):
        fit_costs(1e-3, 1e-3, 1e-3, 1)
    with pytest.raises(ValueError, match="one_s"):
        fit_costs(-1.0, 1e-3, 1e-3, 4)


def test_both_sides_agree_on_the_file_format() -> None:
    assert calibrate.FORMAT == calibration.FORMAT


def test_a_measurement_round_trips_into_the_replay(direct_dir: Path) -> None:
    costs = measure_restore_costs(direct_dir, commands=4, rounds=1, read_threads=2)
    assert costs.restore_overhead_s >= 0 and costs.command_s >= 0
    assert (costs.commands, costs.rounds) == (4, 1)
    assert list(direct_dir.iterdir()) == []  # the sessions are removed
    path = calibrate.write_calibration(direct_dir / "cal.json", costs)
    cal = calibration.load_calibration(path)
    assert cal.restore_overhead_s == pytest.approx(costs.restore_overhead_s)
    assert cal.command_s == pytest.approx(costs.command_s)
    assert str(path) in cal.source


def test_cli_writes_the_file_and_prints_how_to_use_it(
        direct_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    assert main(["bench", "--calibrate", "--quick", "--dir", str(direct_dir),
                 "--calibration-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "restore_overhead_s" in text and f"FLATCAKE_CALIBRATION={out}" in text
    data = json.loads(out.read_text())
    assert data["format"] == calibrate.FORMAT and data["rounds"] == 3


def test_snippet_names_the_numbers() -> None:
    costs = RestoreCosts(0.0012, 0.0002, 0.0015, 0.002, 0.015, 64, 15, "/d")
    text = calibrate.preset_snippet(costs, "/x/c.json")
    assert "restore_overhead_s = 0.0012" in text and "command_s = 0.0002" in text
